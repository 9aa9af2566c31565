package bench

import (
	"encoding/json"
	"math"
	"testing"
	"time"
)

func TestTheStoppingRule(t *testing.T) {
	rule := StopRule{MinRounds: 5, MaxRounds: 12, HalfWidth: 0.10}
	min := time.Minute
	for _, c := range []struct {
		name                string
		done                int
		widest              float64
		spent, last, budget time.Duration
		wantMore            bool
		wantWhy             string
	}{
		{"below the minimum, however narrow", 4, 0.01, 0, min, time.Hour, true, ""},
		{"below the minimum, budget or not", 2, 0.5, 2 * time.Hour, min, time.Hour, true, ""},
		{"wide: one more", 5, 0.15, 10 * min, min, time.Hour, true, ""},
		{"an interval not computable yet counts as wide", 5, math.Inf(1), 10 * min, min, time.Hour, true, ""},
		{"narrow: stop", 5, 0.09, 10 * min, min, time.Hour, false, stopNarrow},
		{"exactly ±10 %: stop", 6, 0.10, 10 * min, min, time.Hour, false, stopNarrow},
		{"wide at the cap: stop", 12, 0.3, 20 * min, min, time.Hour, false, stopCap},
		{"wide, the next round would end past the budget", 7, 0.3, 59 * min, 2 * min, time.Hour, false, stopBudget},
		{"wide, the next round fits the budget", 7, 0.3, 50 * min, 2 * min, time.Hour, true, ""},
		{"no budget: only the cap bounds", 7, 0.3, 50 * time.Hour, 2 * min, 0, true, ""},
	} {
		more, why := rule.next(c.done, c.widest, c.spent, c.last, c.budget)
		if more != c.wantMore || why != c.wantWhy {
			t.Errorf("%s: next = %v, %q; want %v, %q", c.name, more, why, c.wantMore, c.wantWhy)
		}
	}
}

// fakeClock is a clock that moves only when told.
type fakeClock struct{ at time.Time }

func (c *fakeClock) now() time.Time { return c.at }

func TestRoundsAreAddedWhileWideAndStopAtTheCapOrBudget(t *testing.T) {
	rule := StopRule{MinRounds: 5, MaxRounds: 12, HalfWidth: 0.10}
	// widths: the widest interval after each round.
	narrowing := func(r int) float64 { return 0.4 / float64(r) }     // ±10 % after round 4, ±8 % after 5
	slowNarrowing := func(r int) float64 { return 1.0 / float64(r) } // ±10 % after round 10
	neverNarrow := func(int) float64 { return 0.5 }
	for _, c := range []struct {
		name       string
		width      func(int) float64
		budget     time.Duration
		wantRounds int
		wantWhy    string
	}{
		{"narrow before the minimum: the minimum", narrowing, time.Hour, 5, stopNarrow},
		{"narrow after 10 rounds", slowNarrowing, time.Hour, 10, stopNarrow},
		{"never narrow: the cap", neverNarrow, time.Hour, 12, stopCap},
		// 2 minutes a round: after 7 rounds (14 minutes) an eighth fits
		// into 17, a ninth would not.
		{"never narrow, 17 minutes: the budget", neverNarrow, 17 * time.Minute, 8, stopBudget},
		{"a budget under the minimum still gets the minimum", neverNarrow, time.Minute, 5, stopBudget},
	} {
		var measured []int
		clock := &fakeClock{at: time.Unix(0, 0)}
		stop := rule.runRounds(1000, "cold starts", c.budget, clock.now, func(r int) float64 {
			measured = append(measured, r)
			clock.at = clock.at.Add(2 * time.Minute)
			return c.width(r)
		})
		if stop.Rounds != c.wantRounds || stop.Why != c.wantWhy || len(measured) != c.wantRounds || measured[0] != 1 {
			t.Errorf("%s: %d rounds (measured %v), stopped at %q; want %d, %q", c.name, stop.Rounds, measured, stop.Why,
				c.wantRounds, c.wantWhy)
		}
	}
}

func TestTheBudgetIsTheCapOfRoundsOfExpectedColdStarts(t *testing.T) {
	limit := 6 * time.Minute
	if got := expectedSeconds(KP, 5500, limit); !near(got, 0.30+0.5*(1.41-0.30)) {
		t.Errorf("kp at 5,500: %v s, want halfway between 1,000's and 10,000's", got)
	}
	if got := expectedSeconds(KP, 200000, limit); !near(got, 45) {
		t.Errorf("kp at 200,000: %v s, want 100,000's doubled", got)
	}
	if got := expectedSeconds(UpstreamIPTables, 10000, limit); got != limit.Seconds() {
		t.Errorf("upstream-iptables at 10,000 (never finished): %v s, want the limit", got)
	}
	if got := expectedSeconds(UpstreamNFT, 30000, limit); got != limit.Seconds() {
		t.Errorf("upstream-nft at 30,000 (8 minutes): %v s, want the 6-minute limit", got)
	}
	rule := StopRule{MinRounds: 5, MaxRounds: 12, HalfWidth: 0.1}
	round, total := rule.budget([]string{KP, UpstreamIPTables, floorNFT}, 10000,
		func(string) time.Duration { return limit }, 10*time.Second)
	wantRound := time.Duration((1.41 + 10 + 1.88) * float64(time.Second))
	if round != wantRound || total != 12*wantRound+limit+10*time.Second {
		t.Errorf("budget = %v a round, %v in all; want %v, and upstream-iptables's limit once", round, total, wantRound)
	}
}

// A phase stopped with no interval yet (one round) is written to
// results.json and read back: JSON has no infinity (the smoke run's
// results.json failed to encode).
func TestAStopWithoutAnIntervalIsWrittenAndReadBack(t *testing.T) {
	for _, widest := range []float64{math.Inf(1), 0.07} {
		data, err := json.Marshal(Stop{N: 100, Phase: "cold starts", Rounds: 1, Widest: widest})
		if err != nil {
			t.Fatalf("widest %v: %v", widest, err)
		}
		var back Stop
		if err := json.Unmarshal(data, &back); err != nil || back.Widest != widest || back.Rounds != 1 {
			t.Errorf("widest %v: read back %+v, %v from %s", widest, back, err, data)
		}
	}
}
