package server

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

var runnerStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// runnerHarness runs a Runner on a fake clock; its function reports each run
// (as the offset from runnerStart) and returns the next scripted result.
type runnerHarness struct {
	t       *testing.T
	clk     *clocktesting.FakeClock
	runner  *Runner
	runs    chan time.Duration
	mu      sync.Mutex
	results []error
	done    chan struct{}
	cancel  context.CancelFunc
}

func startRunner(t *testing.T, minInterval, maxInterval time.Duration, results ...error) *runnerHarness {
	t.Helper()
	h := &runnerHarness{
		t:       t,
		clk:     clocktesting.NewFakeClock(runnerStart),
		runs:    make(chan time.Duration, 100),
		results: results,
		done:    make(chan struct{}),
	}
	h.runner = NewRunner("test", h.fn, minInterval, maxInterval, h.clk)
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() {
		defer close(h.done)
		h.runner.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-h.done
	})
	return h
}

func (h *runnerHarness) fn(context.Context) error {
	h.runs <- h.clk.Since(runnerStart)
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.results) == 0 {
		return nil
	}
	err := h.results[0]
	h.results = h.results[1:]
	return err
}

// expectRun waits for a run and checks it started at offset at. It then
// waits until the runner armed its next timer, so that the run has ended
// before the test moves the clock again.
func (h *runnerHarness) expectRun(at time.Duration) {
	h.t.Helper()
	select {
	case got := <-h.runs:
		if got != at {
			h.t.Fatalf("run at %s, want %s", got, at)
		}
	case <-time.After(5 * time.Second):
		h.t.Fatalf("no run, want one at %s (clock at %s)", at, h.clk.Since(runnerStart))
	}
	deadline := time.Now().Add(5 * time.Second)
	for !h.clk.HasWaiters() {
		if time.Now().After(deadline) {
			h.t.Fatal("runner did not wait for its next run")
		}
		time.Sleep(time.Millisecond)
	}
}

func (h *runnerHarness) expectNoRun() {
	h.t.Helper()
	select {
	case got := <-h.runs:
		h.t.Fatalf("unexpected run at %s", got)
	case <-time.After(50 * time.Millisecond):
	}
}

// stepTo moves the fake clock to offset at.
func (h *runnerHarness) stepTo(at time.Duration) { h.clk.SetTime(runnerStart.Add(at)) }

func TestRunnerRunsAtOnceWhenStarted(t *testing.T) {
	h := startRunner(t, time.Second, 10*time.Second)
	h.expectRun(0)
	h.expectNoRun()
}

func TestRunnerCoalescesABurstOfTriggersIntoOneRun(t *testing.T) {
	h := startRunner(t, time.Second, 10*time.Second)
	h.expectRun(0)
	for range 5 {
		h.runner.Trigger()
	}
	h.stepTo(999 * time.Millisecond)
	h.expectNoRun()
	h.stepTo(time.Second)
	h.expectRun(time.Second)
	h.stepTo(2 * time.Second)
	h.expectNoRun()
}

func TestRunnerRunsATriggerAtOnceWhenMinIntervalHasPassed(t *testing.T) {
	h := startRunner(t, time.Second, 10*time.Second)
	h.expectRun(0)
	h.stepTo(5 * time.Second)
	h.runner.Trigger()
	h.expectRun(5 * time.Second)
}

func TestRunnerNeverRunsCloserThanMinInterval(t *testing.T) {
	h := startRunner(t, time.Second, 10*time.Second)
	h.expectRun(0)
	for _, at := range []time.Duration{time.Second, 2 * time.Second, 3 * time.Second} {
		h.runner.Trigger()
		h.stepTo(at - time.Millisecond)
		h.expectNoRun()
		h.stepTo(at)
		h.expectRun(at)
	}
}

func TestRunnerResyncsEveryMaxIntervalWithoutTriggers(t *testing.T) {
	h := startRunner(t, time.Second, 10*time.Second)
	h.expectRun(0)
	h.stepTo(9 * time.Second)
	h.expectNoRun()
	h.stepTo(10 * time.Second)
	h.expectRun(10 * time.Second)
	h.stepTo(20 * time.Second)
	h.expectRun(20 * time.Second)
}

func TestRunnerRetriesAFailedRunWithBackoffUpToMaxInterval(t *testing.T) {
	fail := errors.New("kernel said no")
	h := startRunner(t, time.Second, 10*time.Second, fail, fail, fail, fail, fail)
	// Backoffs: 1s, 2s, 4s, 8s, then capped at 10s; success returns to the
	// periodic resync.
	for _, at := range []time.Duration{0, 1 * time.Second, 3 * time.Second, 7 * time.Second, 15 * time.Second, 25 * time.Second, 35 * time.Second} {
		if at > 0 {
			h.stepTo(at - time.Millisecond)
			h.expectNoRun()
			h.stepTo(at)
		}
		h.expectRun(at)
	}
}

func TestRunnerBackoffStartsAtOneSecondWhenMinIntervalIsShorter(t *testing.T) {
	h := startRunner(t, 100*time.Millisecond, 10*time.Second, errors.New("no"))
	h.expectRun(0)
	h.stepTo(900 * time.Millisecond)
	h.expectNoRun()
	h.stepTo(time.Second)
	h.expectRun(time.Second)
}

func TestRunnerTriggerDuringBackoffRunsAfterMinInterval(t *testing.T) {
	fail := errors.New("no")
	h := startRunner(t, 100*time.Millisecond, 10*time.Second, fail, fail)
	h.expectRun(0)
	h.runner.Trigger()
	h.stepTo(100 * time.Millisecond)
	h.expectRun(100 * time.Millisecond)
	// The second failure still doubles the backoff: 100ms + 2s.
	h.stepTo(2 * time.Second)
	h.expectNoRun()
	h.stepTo(2100 * time.Millisecond)
	h.expectRun(2100 * time.Millisecond)
}

func TestRunnerSuccessResetsTheBackoff(t *testing.T) {
	fail := errors.New("no")
	h := startRunner(t, time.Second, 10*time.Second, fail, fail, nil, fail)
	h.expectRun(0)
	h.stepTo(time.Second)
	h.expectRun(time.Second)
	h.stepTo(3 * time.Second)
	h.expectRun(3 * time.Second) // succeeds
	h.runner.Trigger()
	h.stepTo(4 * time.Second)
	h.expectRun(4 * time.Second) // fails: retried after 1s, not 4s
	h.stepTo(5 * time.Second)
	h.expectRun(5 * time.Second)
}

func TestRunnerStopsWhenContextIsCancelled(t *testing.T) {
	h := startRunner(t, time.Second, 10*time.Second)
	h.expectRun(0)
	h.cancel()
	select {
	case <-h.done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestNewRunnerRejectsMaxIntervalBelowMinInterval(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("no panic for maxInterval < minInterval")
		}
	}()
	NewRunner("bad", func(context.Context) error { return nil }, time.Minute, time.Second, clocktesting.NewFakeClock(runnerStart))
}
