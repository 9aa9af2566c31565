package proxy

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestPollDriftReportsEachDriftAndLogsARepeatedErrorOnce(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	calls := 0
	check := func(context.Context) (*Drift, error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		switch {
		case calls <= 3:
			return nil, errors.New("iptables-save: exit status 4")
		case calls == 4:
			return &Drift{What: "nat KP-SERVICES: 0 rules, kp wrote 4"}, nil
		case calls == 6:
			cancel()
		}
		return nil, nil
	}
	var got []Drift
	var logs bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- PollDrift(ctx, time.Millisecond, check, func(d Drift) { got = append(got, d) },
			slog.New(slog.NewTextHandler(&logs, nil)))
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("PollDrift did not return after ctx ended")
	}
	if len(got) != 1 || got[0].What != "nat KP-SERVICES: 0 rules, kp wrote 4" {
		t.Errorf("drifts reported: %+v, want the one", got)
	}
	if n := strings.Count(logs.String(), "exit status 4"); n != 1 {
		t.Errorf("the same error logged %d times, want once:\n%s", n, logs.String())
	}
}

func TestPollDriftWithNoPeriodChecksNothing(t *testing.T) {
	check := func(context.Context) (*Drift, error) {
		t.Error("checked with period 0")
		return nil, nil
	}
	if err := PollDrift(context.Background(), 0, check, func(Drift) {}, nil); err != nil {
		t.Fatal(err)
	}
}

func TestPollDriftWaitsLongerAfterASlowCheck(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var starts []time.Time
	check := func(context.Context) (*Drift, error) {
		starts = append(starts, time.Now())
		if len(starts) == 2 {
			cancel()
		}
		time.Sleep(20 * time.Millisecond)
		return nil, nil
	}
	if err := PollDrift(ctx, time.Millisecond, check, func(Drift) {}, nil); err != nil {
		t.Fatal(err)
	}
	if len(starts) != 2 {
		t.Fatalf("%d checks", len(starts))
	}
	// 20 ms of check: the next waits at least ten times that.
	if gap := starts[1].Sub(starts[0]); gap < 200*time.Millisecond {
		t.Errorf("the second check started %v after the first, want at least 220ms", gap)
	}
}
