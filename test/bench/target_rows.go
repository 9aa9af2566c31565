package bench

import (
	"fmt"
	"slices"
	"strings"
)

// The target rows a kp mode shares with its upstream counterpart (issue
// 13's iptables, issue 15's ipvs): cold start, the proxy's own sync time
// per endpoint change, peak RSS with children.

// coldStartRow judges "cold start ≥ speedup× faster than upstream's"
// (upName is how the row names upstream). An upstream that ran out of
// time gives a lower bound of the ratio, which settles the target only if
// it already reaches speedup. It returns whether upstream's time is such a
// bound.
func coldStartRow(b *strings.Builder, r *Results, n int, kpMode, upstream, upName string, speedup float64) (upBound bool) {
	kp, kpBound := r.coldStart(kpMode, n)
	up, upBound := r.coldStart(upstream, n)
	ratio := up / kp
	measured := fmt.Sprintf("%s %s; %s %s", kpMode, fmtColdStart(kp, kpBound), upstream, fmtColdStart(up, upBound))
	v := judge(ratio >= speedup, known(kp, up))
	switch {
	case v == unmeasured:
	case kpBound && upBound:
		v, measured = undecided, measured+": both ran out of time"
	case upBound:
		measured += fmt.Sprintf(": upstream / %s ≥ %s (a lower bound: upstream's true time is longer)", kpMode, fmtRatio(ratio))
		if v == missed {
			v = undecided
		}
	case kpBound:
		measured += fmt.Sprintf(": upstream / %s ≤ %s", kpMode, fmtRatio(ratio))
		if v == met {
			v = undecided
		}
	default:
		measured += fmt.Sprintf(": upstream / %s = %s", kpMode, fmtRatio(ratio))
	}
	targetRow(b, fmt.Sprintf("cold start ≥ %.0f× faster than %s", speedup, upName), measured, v)
	return upBound
}

// ownSyncRow judges "one endpoint change: kp's own sync ≤ fraction of
// upstream's", each proxy's sync time for the change (its sync duration
// metric), medians.
func ownSyncRow(b *strings.Builder, r *Results, n int, kpMode, upstream string, fraction float64, upBound bool) {
	own := func(p string) float64 {
		return Median(slices.DeleteFunc(r.incremental(p, n, func(i Incremental) float64 { return i.SyncSeconds }),
			func(x float64) bool { return x <= 0 }))
	}
	kpInc, upInc := own(kpMode), own(upstream)
	measured := fmt.Sprintf("median sync per change: %s %s, %s %s: %s", kpMode, fmtSeconds(kpInc),
		upstream, fmtSeconds(upInc), fmtRatio(kpInc/upInc))
	if upBound {
		measured += " (upstream's cold start did not finish, so no change of upstream's was measured)"
	}
	targetRow(b, fmt.Sprintf("one endpoint change: %s's own sync ≤ %s of upstream's", kpMode, fmtFraction(fraction)),
		measured, judge(kpInc/upInc <= fraction, known(kpInc, upInc)))
}

// peakRSSRow judges "peak RSS (process + its child) ≤ fraction of
// upstream's": an upstream that ran out of time had reached at least its
// peak so far. child names the helper (iptables-restore, ipset) and upName
// upstream, possessive.
func peakRSSRow(b *strings.Builder, r *Results, n int, kpMode, upstream, child, upName string, fraction float64) {
	kpRSS, kpRSSBound := r.peakRSS(kpMode, n)
	upRSS, upRSSBound := r.peakRSS(upstream, n)
	v := judge(kpRSS/upRSS <= fraction, known(kpRSS, upRSS))
	if (v == met && kpRSSBound) || (v == missed && upRSSBound) {
		v = undecided
	}
	what := "peak RSS (process + its " + child + " child) ≤ " + upName
	if fraction != 1 {
		what = fmt.Sprintf("peak RSS (process + its %s child) ≤ %s of %s", child, fmtFraction(fraction), upName)
	}
	targetRow(b, what,
		fmt.Sprintf("%s %s vs %s %s: %s", kpMode, atLeast(fmtBytes(kpRSS), kpRSSBound), upstream,
			atLeast(fmtBytes(upRSS), upRSSBound), fmtRatio(kpRSS/upRSS)), v)
}
