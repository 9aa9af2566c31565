package netns

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestSummaryCountsASlowAnswerAsAFailure(t *testing.T) {
	at := time.Date(2024, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name         string
		attempts     []Attempt
		failed, slow int
		worst        time.Duration
		firstFailure string // a word of the first failure's line
	}{
		{name: "all quick", attempts: []Attempt{
			{At: at, Connect: time.Millisecond, Answer: 2 * time.Millisecond},
			{At: at, Connect: 5 * time.Millisecond, Answer: 7 * time.Millisecond},
		}, worst: 7 * time.Millisecond},
		{name: "a SYN sent again is slow, although answered", attempts: []Attempt{
			{At: at, Connect: time.Millisecond, Answer: 2 * time.Millisecond},
			{At: at, Addr: "10.96.0.10:80", Connect: 1010 * time.Millisecond, Answer: 1012 * time.Millisecond},
		}, failed: 1, slow: 1, worst: 1012 * time.Millisecond, firstFailure: "SYN was sent again"},
		{name: "an answer slow behind a quick handshake (a proxy's own listener)", attempts: []Attempt{
			{At: at, Connect: time.Millisecond, Answer: 1005 * time.Millisecond},
		}, failed: 1, slow: 1, worst: 1005 * time.Millisecond, firstFailure: "slow"},
		{name: "an error fails and is not the worst answer", attempts: []Attempt{
			{At: at, Connect: 3 * time.Millisecond, Answer: 4 * time.Millisecond},
			{At: at, Connect: 5 * time.Second, Err: errors.New("i/o timeout")},
		}, failed: 1, worst: 4 * time.Millisecond, firstFailure: "i/o timeout"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := Summarize(c.attempts, SlowConnect)
			if len(s.Failures) != c.failed || s.Slow != c.slow || s.Worst != c.worst {
				t.Errorf("%d failed, %d slow, worst %v; want %d, %d, %v (%s)", len(s.Failures), s.Slow, s.Worst, c.failed, c.slow, c.worst, s)
			}
			err := s.Err()
			switch {
			case c.failed == 0 && err != nil:
				t.Errorf("no failure expected, got %v", err)
			case c.failed > 0 && (err == nil || !strings.Contains(strings.SplitN(err.Error(), "\n", 2)[0], c.firstFailure)):
				t.Errorf("want the first line to name %q, got %v", c.firstFailure, err)
			}
		})
	}
}
