package bench

import (
	"math"
	"testing"
)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*max(1, math.Abs(b)) }

func TestTheIntervalIsAStudentTIntervalOnLogs(t *testing.T) {
	// logs 0, 1, 2: mean 1, sample sd 1, t(2 df) = 4.303, half-width
	// 4.303/√3 on the log scale.
	iv := logInterval([]float64{1, math.E, math.E * math.E})
	half := 4.303 / math.Sqrt(3)
	if !near(iv.Mid, math.E) || !near(iv.Lo, math.Exp(1-half)) || !near(iv.Hi, math.Exp(1+half)) || iv.Rounds != 3 {
		t.Errorf("logInterval = %+v, want e, e^(1∓%.4f), 3 rounds", iv, half)
	}
	// Ratios of 0.8 and 1.25 are as far from 1 as each other: the
	// geometric mean of the two is 1.
	if iv := logInterval([]float64{0.8, 1.25}); !near(iv.Mid, 1) {
		t.Errorf("geometric mean of 0.8 and 1.25 = %v, want 1", iv.Mid)
	}
	for name, xs := range map[string][]float64{"one value": {2}, "a zero": {1, 0, 2}, "a NaN": {1, math.NaN()}} {
		if iv := logInterval(xs); iv.ok() {
			t.Errorf("%s: an interval %+v", name, iv)
		}
	}
}

func TestPairedRatiosPairTheFiguresOfOneRound(t *testing.T) {
	// The machine slows round by round; kp stays twice as fast as
	// upstream within each round: every paired ratio is 0.5 exactly.
	kp := []float64{1, 2, 4, 8, 16}
	up := []float64{2, 4, 8, 16, 32}
	if iv := pairedInterval(kp, up); !near(iv.Mid, 0.5) || !near(iv.Lo, 0.5) || !near(iv.Hi, 0.5) {
		t.Errorf("paired = %+v, want 0.5 with no width", iv)
	}
	// Unpaired, the same figures say nothing sure about the ratio.
	if iv := unpairedInterval(kp, up); !(iv.Lo < 0.2 && iv.Hi > 1) {
		t.Errorf("unpaired = %+v, want an interval holding both 0.2 and 1", iv)
	}
	if iv := pairedInterval(kp, up[:4]); iv.ok() {
		t.Errorf("rounds that do not pair gave an interval %+v", iv)
	}
}

func TestTheUnpairedIntervalIsWelchsOnLogs(t *testing.T) {
	// logs of a: 1, 3 (mean 2, variance 2); of b: 0, 2 (mean 1, variance
	// 2): se = √(2/2 + 2/2) = √2, Welch's df = 2, t = 4.303.
	iv := unpairedInterval([]float64{math.E, math.Exp(3)}, []float64{1, math.E * math.E})
	half := 4.303 * math.Sqrt2
	if !near(iv.Mid, math.E) || !near(iv.Lo, math.Exp(1-half)) || !near(iv.Hi, math.Exp(1+half)) {
		t.Errorf("unpairedInterval = %+v, want e, e^(1∓%.4f)", iv, half)
	}
}

func TestTQuantileMatchesTheTables(t *testing.T) {
	for df, want := range map[int]float64{1: 12.706, 4: 2.776, 11: 2.201, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980, 100000: 1.960} {
		if got := tQuantile975(df); math.Abs(got-want) > 0.0015 {
			t.Errorf("t(0.975, %d) = %.4f, want %.3f", df, got, want)
		}
	}
}

func TestATargetIsDecidedByTheSideOfItsIntervalThatMatters(t *testing.T) {
	iv := func(lo, hi float64) Interval { return Interval{Mid: math.Sqrt(lo * hi), Lo: lo, Hi: hi, Rounds: 5} }
	for _, c := range []struct {
		name   string
		iv     Interval
		dir    direction
		target float64
		want   verdict
	}{
		{"≥: the whole interval above", iv(1.02, 1.2), atLeastTarget, 1, met},
		{"≥: the lower bound on the target", iv(1, 1.2), atLeastTarget, 1, met},
		{"≥: the whole interval below", iv(0.8, 0.98), atLeastTarget, 1, missed},
		{"≥: straddling, the middle above", iv(0.97, 1.2), atLeastTarget, 1, undecided},
		{"≥: straddling, the middle below", iv(0.8, 1.03), atLeastTarget, 1, undecided},
		{"≤: the whole interval below", iv(0.05, 0.09), atMostTarget, 0.1, met},
		{"≤: the whole interval above", iv(0.11, 0.2), atMostTarget, 0.1, missed},
		{"≤: straddling", iv(0.08, 0.12), atMostTarget, 0.1, undecided},
		{"one round: no interval", Interval{Mid: 2, Lo: math.NaN(), Hi: math.NaN(), Rounds: 1}, atLeastTarget, 1, undecided},
		{"nothing measured", Interval{Mid: math.NaN(), Lo: math.NaN(), Hi: math.NaN()}, atLeastTarget, 1, unmeasured},
	} {
		if got := decide(c.iv, c.dir, c.target); got != c.want {
			t.Errorf("%s: decide(%v–%v, %v) = %v, want %v", c.name, c.iv.Lo, c.iv.Hi, c.target, got, c.want)
		}
	}
}
