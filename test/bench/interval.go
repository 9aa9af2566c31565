package bench

import (
	"fmt"
	"math"
)

// The statistics a target is judged on: the 95 % interval of a ratio.
//
// A ratio of two proxies (or of a proxy and its reference) is taken round
// by round: round r's figure of each was measured minutes apart at most,
// so the drift of the machine over the run (±10–30 % over an hour on this
// shared 2-core host, NOTES.md) falls on both alike. The interval is a
// Student t-interval on the logarithms of the per-round ratios, turned back
// into a ratio (around their geometric mean). Why this and not a bootstrap:
// a run has 5–12 rounds, and a percentile bootstrap of 5 values draws from
// only 126 distinct resamples and covers well under 95 % at that size,
// while the t-interval on logs is exact when the log ratios are normal
// (timings and rates are multiplicative: a ratio of 2 and of ½ are
// equally far from 1), needs no seed, and can be checked by hand.

// Interval is a ratio's point estimate (the geometric mean of the per-round
// ratios) and its 95 % interval, over Rounds values.
type Interval struct {
	Mid, Lo, Hi float64
	Rounds      int
}

// ok says whether the interval could be computed (at least 2 values).
func (iv Interval) ok() bool { return iv.Rounds >= 2 && known(iv.Mid, iv.Lo, iv.Hi) }

// halfWidth is how far the interval reaches from its middle, as a fraction
// (0.10: ±10 %), the wider side: on the log scale the two are equal.
func (iv Interval) halfWidth() float64 {
	if !iv.ok() {
		return math.Inf(1)
	}
	return max(iv.Hi/iv.Mid, iv.Mid/iv.Lo) - 1
}

func (iv Interval) String() string {
	if !iv.ok() {
		return fmt.Sprintf("%s (%d rounds: no interval)", fmtRatio(iv.Mid), iv.Rounds)
	}
	return fmt.Sprintf("%s, 95%% interval %s–%s (%d rounds)", fmtRatio(iv.Mid), fmtRatio(iv.Lo), fmtRatio(iv.Hi), iv.Rounds)
}

// logInterval is the t-interval of the mean of logs, exponentiated: the
// geometric mean of xs and its 95 % interval. Values that are not
// positive numbers are refused (ok false).
func logInterval(xs []float64) Interval {
	iv := Interval{Mid: math.NaN(), Lo: math.NaN(), Hi: math.NaN(), Rounds: len(xs)}
	logs := make([]float64, len(xs))
	for i, x := range xs {
		if !(x > 0) || math.IsInf(x, 0) {
			return iv
		}
		logs[i] = math.Log(x)
	}
	m, v := meanVar(logs)
	if len(xs) > 0 {
		iv.Mid = math.Exp(m)
	}
	if len(xs) < 2 {
		return iv
	}
	half := tQuantile975(len(xs)-1) * math.Sqrt(v/float64(len(xs)))
	iv.Lo, iv.Hi = math.Exp(m-half), math.Exp(m+half)
	return iv
}

// pairedInterval is the interval of a/b from rounds paired by index:
// a[i] and b[i] were measured in the same round.
func pairedInterval(a, b []float64) Interval {
	if len(a) != len(b) {
		return Interval{Mid: math.NaN(), Lo: math.NaN(), Hi: math.NaN()}
	}
	ratios := make([]float64, len(a))
	for i := range a {
		ratios[i] = a[i] / b[i]
	}
	return logInterval(ratios)
}

// unpairedInterval is the interval of the ratio of the geometric means of
// a and b where no value of a belongs with one of b (endpoint changes of
// two proxies, made minutes apart; one N against another): Welch's
// t-interval on the difference of the mean logs.
func unpairedInterval(a, b []float64) Interval {
	nan := Interval{Mid: math.NaN(), Lo: math.NaN(), Hi: math.NaN(), Rounds: min(len(a), len(b))}
	la, lb := make([]float64, len(a)), make([]float64, len(b))
	for i, x := range a {
		if !(x > 0) || math.IsInf(x, 0) {
			return nan
		}
		la[i] = math.Log(x)
	}
	for i, x := range b {
		if !(x > 0) || math.IsInf(x, 0) {
			return nan
		}
		lb[i] = math.Log(x)
	}
	if len(a) == 0 || len(b) == 0 {
		return nan
	}
	ma, va := meanVar(la)
	mb, vb := meanVar(lb)
	iv := nan
	iv.Mid = math.Exp(ma - mb)
	if len(a) < 2 || len(b) < 2 {
		return iv
	}
	sa, sb := va/float64(len(a)), vb/float64(len(b))
	se := math.Sqrt(sa + sb)
	df := 1 // both without spread: the interval is a point
	if se > 0 {
		df = int(math.Floor((sa + sb) * (sa + sb) / (sa*sa/float64(len(a)-1) + sb*sb/float64(len(b)-1))))
	}
	half := tQuantile975(max(df, 1)) * se
	iv.Lo, iv.Hi = math.Exp(ma-mb-half), math.Exp(ma-mb+half)
	return iv
}

// meanVar is the mean and the sample variance (n-1) of xs.
func meanVar(xs []float64) (mean, variance float64) {
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	if len(xs) < 2 {
		return mean, 0
	}
	for _, x := range xs {
		variance += (x - mean) * (x - mean)
	}
	return mean, variance / float64(len(xs)-1)
}

// t975 is the 0.975 quantile of Student's t with 1…30 degrees of freedom.
var t975 = [...]float64{12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
	2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
	2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042}

// tQuantile975 is the 0.975 quantile of Student's t with df degrees of
// freedom: the table up to 30, beyond it the Cornish–Fisher expansion
// around the normal's 1.960 (within 0.001 of the exact value there).
func tQuantile975(df int) float64 {
	if df >= 1 && df <= len(t975) {
		return t975[df-1]
	}
	z, d := 1.959964, float64(df)
	return z + (z*z*z+z)/(4*d) + (5*z*z*z*z*z+16*z*z*z+3*z)/(96*d*d)
}

// direction is which way a target points.
type direction int

const (
	atLeastTarget direction = iota // "≥ target": met when the interval lies above it
	atMostTarget                   // "≤ target": met when the interval lies below it
)

// decide judges a ratio against a target from its interval: a "≥" target
// is met when the interval's lower bound reaches it and missed when its
// upper bound does not; a "≤" target the other way round. An interval
// that holds the target decides nothing (undecided), and so does an
// interval that could not be computed (fewer than 2 rounds).
func decide(iv Interval, dir direction, target float64) verdict {
	if !known(iv.Mid) {
		return unmeasured
	}
	if !iv.ok() {
		return undecided
	}
	lo, hi := iv.Lo, iv.Hi
	if dir == atMostTarget {
		// "x ≤ t" is "1/x ≥ 1/t".
		lo, hi, target = 1/hi, 1/lo, 1/target
	}
	switch {
	case lo >= target:
		return met
	case hi < target:
		return missed
	}
	return undecided
}
