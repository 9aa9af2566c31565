package bench

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// Target values from issue 7 (kp's nftables mode), judged in the report
// (never asserted).
const (
	targetN             = 10000
	targetSpeedup       = 10.0  // full sync vs upstream nftables
	targetFloorRatio    = 1.5   // full sync vs nft -f
	targetIncremental   = 0.010 // seconds, one endpoint change at targetN
	targetRSSFraction   = 1.0 / 3
	targetDataPathRatio = 0.95 // rate at the largest N vs N = 1
)

// Target values from issue 13 (kp's iptables mode against upstream's),
// set for targetN like issue 7's.
const (
	iptTargetSpeedup       = 10.0 // cold start vs upstream iptables mode
	iptTargetSyncFraction  = 0.1  // kp's own sync per change vs upstream's
	iptTargetDataPathRatio = 0.90 // rate at N vs N = 1
	iptTargetRSSFraction   = 1.0  // peak RSS, process and child, vs upstream's
)

// verdict is how a target row ends.
type verdict int

const (
	unmeasured verdict = iota
	met
	missed
	// undecided: one side is only a bound (a cold start ran out of time)
	// and the bound does not settle the target, or the measured values
	// fall short but their noise reaches the target (paired rounds).
	undecided
)

func (v verdict) String() string {
	switch v {
	case met:
		return "✓ met"
	case missed:
		return "✗ missed"
	case undecided:
		return "? undecided"
	}
	return "not measured"
}

// judge is met when ok, missed otherwise, unmeasured when known is false.
func judge(ok, known bool) verdict {
	switch {
	case !known:
		return unmeasured
	case ok:
		return met
	}
	return missed
}

func targetRow(b *strings.Builder, what, measured string, v verdict) {
	fmt.Fprintf(b, "| %s | %s | **%s** |\n", what, measured, v)
}

// writeTargets judges issue 7's targets (set for targetN) at n, from the
// medians.
func writeTargets(b *strings.Builder, r *Results, n int) {
	sec := func(f FullSync) float64 { return f.Seconds }
	kp := Median(r.fullSync(KP, n, sec))
	nft := Median(r.fullSync(UpstreamNFT, n, sec))
	floor := Median(r.floor(KP, n))
	inc := Median(slices.DeleteFunc(r.incremental(KP, n, func(i Incremental) float64 { return i.SyncSeconds }),
		func(x float64) bool { return x <= 0 }))
	rss := func(p string) float64 {
		return Median(r.fullSync(p, n, func(f FullSync) float64 { return float64(f.PeakRSS) }))
	}
	largest := n
	dp, dpDesc := r.rateVsN1(KP, largest)

	fmt.Fprintf(b, "## Targets (issue 7, set for N = %s), judged at N = %s\n\n", fmtN(targetN), fmtN(n))
	b.WriteString("| target | measured | |\n|---|---|---|\n")
	targetRow(b, fmt.Sprintf("full sync ≥ %.0f× faster than upstream nftables", targetSpeedup),
		fmt.Sprintf("%s vs %s: upstream / kp = %s", fmtSeconds(kp), fmtSeconds(nft), fmtRatio(nft/kp)),
		judge(nft/kp >= targetSpeedup, known(kp, nft)))
	targetRow(b, fmt.Sprintf("full sync within %.1f× of the nft -f floor", targetFloorRatio),
		fmt.Sprintf("%s vs %s: %s", fmtSeconds(kp), fmtSeconds(floor), fmtRatio(kp/floor)),
		judge(kp/floor <= targetFloorRatio, known(kp, floor)))
	targetRow(b, fmt.Sprintf("one endpoint change under %s to the kernel", fmtSeconds(targetIncremental)),
		fmt.Sprintf("median %s (kp's own sync time per change)", fmtSeconds(inc)), judge(inc < targetIncremental, known(inc)))
	for _, p := range []string{UpstreamNFT, UpstreamIPTables} {
		targetRow(b, "peak RSS at most a third of "+p+"'s",
			fmt.Sprintf("%s vs %s: %s", fmtBytes(rss(KP)), fmtBytes(rss(p)), fmtRatio(rss(KP)/rss(p))),
			judge(rss(KP)/rss(p) <= targetRSSFraction, known(rss(KP), rss(p))))
	}
	targetRow(b, fmt.Sprintf("connection rate at N = %s at least %.0f%% of N = 1", fmtN(largest), targetDataPathRatio*100),
		dpDesc, judge(dp >= targetDataPathRatio, known(dp) && largest > 1))
	b.WriteString("\n")
}

// coldStart is the median of proxy's finished cold starts at n; when none
// finished but one ran into its time limit, it is that limit and bound is
// set (the true time is longer).
func (r *Results) coldStart(proxy string, n int) (v float64, bound bool) {
	if done := r.fullSync(proxy, n, func(f FullSync) float64 { return f.Seconds }); len(done) > 0 {
		return Median(done), false
	}
	if t := r.unfinished(proxy, n); t > 0 {
		return t, true
	}
	return math.NaN(), false
}

// atLeast prints v, with "≥ " when it is a lower bound.
func atLeast(v string, bound bool) string {
	if bound {
		return "≥ " + v
	}
	return v
}

// writeIPTablesTargets judges issue 13's targets (kp-iptables against
// upstream iptables mode, set for targetN) at n, from the medians.
func writeIPTablesTargets(b *strings.Builder, r *Results, n int) {
	fmt.Fprintf(b, "## Targets (issue 13: %s against %s, set for N = %s), judged at N = %s\n\n",
		KPIPTables, UpstreamIPTables, fmtN(targetN), fmtN(n))
	b.WriteString("| target | measured | |\n|---|---|---|\n")

	upBound := coldStartRow(b, r, n, KPIPTables, UpstreamIPTables, "upstream iptables mode", iptTargetSpeedup)
	ownSyncRow(b, r, n, KPIPTables, UpstreamIPTables, iptTargetSyncFraction, upBound)

	// Data path: kp's rate at n against its rate at N = 1; upstream's shown
	// beside it, not judged.
	kpRatio, kpDesc := r.rateVsN1(KPIPTables, n)
	_, upDesc := r.rateVsN1(UpstreamIPTables, n)
	targetRow(b, fmt.Sprintf("new connections/s at N = %s ≥ %.0f%% of N = 1", fmtN(n), iptTargetDataPathRatio*100),
		fmt.Sprintf("%s %s; %s %s", KPIPTables, kpDesc, UpstreamIPTables, upDesc),
		judge(kpRatio >= iptTargetDataPathRatio, known(kpRatio) && n > 1))

	peakRSSRow(b, r, n, KPIPTables, UpstreamIPTables, "iptables-restore", "upstream iptables mode's", iptTargetRSSFraction)
	b.WriteString("\n")
}

// fmtColdStart prints a cold start's time; a bound is a time limit run into.
func fmtColdStart(v float64, bound bool) string {
	if bound {
		return "> " + fmtSeconds(v) + " (did not finish within the cold-start time limit)"
	}
	return fmtSeconds(v)
}

// fmtFraction writes 0.1 as 1/10.
func fmtFraction(f float64) string { return fmt.Sprintf("1/%.0f", 1/f) }
