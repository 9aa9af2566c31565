package bench

import (
	"fmt"
	"slices"
	"strings"
)

// The target rows the targets of issues 7, 13, 14, 15 and 16 are made of.
// Each is decided on the 95 % interval of its ratio (decide), the figures
// paired by round where they were measured in rounds; a row one of whose
// proxies timed out or programmed nothing is a miss (Results.timedOut).

// judgeRow writes a row decided by iv against target, or missed when a why
// says a proxy of the row has no measurement.
func judgeRow(b *strings.Builder, what, measured string, iv Interval, dir direction, target float64, whys ...string) {
	v := decide(iv, dir, target)
	for _, why := range whys {
		if why != "" {
			v, measured = missed, measured+"; "+why
		}
	}
	targetRow(b, what, measured, v)
}

func seconds(f FullSync) float64 { return f.Seconds }

// coldStartRow judges "cold start ≥ speedup× faster than upstream's"
// (upName is how the row names upstream) on upstream / kp, round by round.
func coldStartRow(b *strings.Builder, r *Results, n int, kpMode, upstream, upName string, speedup float64) {
	k, u := r.coldStarts(kpMode, n, seconds), r.coldStarts(upstream, n, seconds)
	iv := ratio(u, k)
	measured := fmt.Sprintf("%s %s, %s %s (medians); upstream / %s by round: %s", kpMode, fmtSeconds(Median(k.values())),
		upstream, fmtSeconds(Median(u.values())), kpMode, iv)
	judgeRow(b, fmt.Sprintf("cold start ≥ %.0f× faster than %s", speedup, upName), measured, iv, atLeastTarget, speedup,
		r.timedOut(kpMode, n), r.timedOut(upstream, n))
}

// floorRow judges "cold start within limit× of the floor" on kpMode's cold
// start over its reference's load (ref), round by round.
func floorRow(b *strings.Builder, r *Results, n int, kpMode, ref string, limit float64) {
	k, f := r.coldStarts(kpMode, n, seconds), r.floors(ref, n)
	iv := ratio(k, f)
	measured := fmt.Sprintf("%s %s vs %s %s (medians); by round: %s", kpMode, fmtSeconds(Median(k.values())), ref,
		fmtSeconds(Median(f.values())), iv)
	judgeRow(b, fmt.Sprintf("full sync within %.1f× of the %s floor", limit, ref), measured, iv, atMostTarget, limit,
		r.timedOut(kpMode, n))
}

// measuredSyncs are proxy's own sync times per change at n, those the
// metric gave (> 0).
func (r *Results) measuredSyncs(proxy string, n int) []float64 {
	return slices.DeleteFunc(r.ownSyncs(proxy, n), func(x float64) bool { return x <= 0 })
}

// fmtSecondsInterval prints an interval of times.
func fmtSecondsInterval(iv Interval, what string) string {
	if !iv.ok() {
		return fmt.Sprintf("%s (%d %s: no interval)", fmtSeconds(iv.Mid), iv.Rounds, what)
	}
	return fmt.Sprintf("%s, 95%% interval %s–%s (%d %s)", fmtSeconds(iv.Mid), fmtSeconds(iv.Lo), fmtSeconds(iv.Hi), iv.Rounds, what)
}

// ownSyncUnderRow judges "one endpoint change: kpMode's own sync ≤ limit"
// on the geometric mean of its changes' own sync times (the changes are
// not in rounds: there is nothing to pair them with).
func ownSyncUnderRow(b *strings.Builder, r *Results, n int, kpMode string, limit float64) {
	iv := logInterval(r.measuredSyncs(kpMode, n))
	judgeRow(b, fmt.Sprintf("one endpoint change: %s's own sync ≤ %s", kpMode, fmtSeconds(limit)),
		"geometric mean "+fmtSecondsInterval(iv, "changes"), iv, atMostTarget, limit, r.timedOut(kpMode, n))
}

// ownSyncRow judges "one endpoint change: kp's own sync ≤ fraction of
// upstream's": the changes of the two were made minutes apart, in each
// proxy's turn, so they do not pair: Welch's interval of the ratio of the
// geometric means.
func ownSyncRow(b *strings.Builder, r *Results, n int, kpMode, upstream string, fraction float64) {
	k, u := r.measuredSyncs(kpMode, n), r.measuredSyncs(upstream, n)
	iv := unpairedInterval(k, u)
	measured := fmt.Sprintf("geometric means of the changes' own syncs: %s %s, %s %s; ratio %s, 95%% interval %s–%s (%d and %d changes, unpaired)",
		kpMode, fmtSeconds(logInterval(k).Mid), upstream, fmtSeconds(logInterval(u).Mid), fmtRatio(iv.Mid), fmtRatio(iv.Lo),
		fmtRatio(iv.Hi), len(k), len(u))
	judgeRow(b, fmt.Sprintf("one endpoint change: %s's own sync ≤ %s of upstream's", kpMode, fmtFraction(fraction)),
		measured, iv, atMostTarget, fraction, r.timedOut(kpMode, n), r.timedOut(upstream, n))
}

// rssRow judges "peak RSS ≤ fraction of upstream's" (what names the row),
// value the peak of a cold start, round by round.
func rssRow(b *strings.Builder, r *Results, n int, kpMode, upstream, what string, value func(FullSync) float64, fraction float64) {
	k, u := r.coldStarts(kpMode, n, value), r.coldStarts(upstream, n, value)
	iv := ratio(k, u)
	measured := fmt.Sprintf("%s %s vs %s %s (medians); by round: %s", kpMode, fmtBytes(Median(k.values())), upstream,
		fmtBytes(Median(u.values())), iv)
	judgeRow(b, what, measured, iv, atMostTarget, fraction, r.timedOut(kpMode, n), r.timedOut(upstream, n))
}

// rateVsN1Row judges "new connections/s at n ≥ share of N = 1" (rateVsN1);
// more is added to what the row shows.
func rateVsN1Row(b *strings.Builder, r *Results, n int, kpMode string, share float64, more string) {
	what := fmt.Sprintf("%s's new connections/s at N = %s ≥ %.0f%% of N = 1", kpMode, fmtN(n), share*100)
	if n == 1 {
		targetRow(b, what, "(judged from N = 1,000 on)", unmeasured)
		return
	}
	iv, desc := r.rateVsN1(kpMode, n)
	judgeRow(b, what, kpMode+" "+desc+more, iv, atLeastTarget, share, r.timedOut(kpMode, n), r.timedOut(kpMode, 1))
}
