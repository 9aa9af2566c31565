package bench

import (
	"fmt"
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
	// undecided: the 95 % interval of the ratio holds the target, or
	// has too few rounds to be computed.
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

func targetRow(b *strings.Builder, what, measured string, v verdict) {
	fmt.Fprintf(b, "| %s | %s | **%s** |\n", what, measured, v)
}

// writeTargets judges issue 7's targets (set for targetN) at n, each on
// the 95 % interval of its ratio (interval.go).
func writeTargets(b *strings.Builder, r *Results, n int) {
	fmt.Fprintf(b, "## Targets (issue 7, set for N = %s), judged at N = %s\n\n", fmtN(targetN), fmtN(n))
	b.WriteString("| target | measured | |\n|---|---|---|\n")
	coldStartRow(b, r, n, KP, UpstreamNFT, "upstream nftables", targetSpeedup)
	floorRow(b, r, n, KP, floorNFT, targetFloorRatio)
	ownSyncUnderRow(b, r, n, KP, targetIncremental)
	process := func(f FullSync) float64 { return float64(f.PeakRSS) }
	for _, p := range []string{UpstreamNFT, UpstreamIPTables} {
		rssRow(b, r, n, KP, p, "peak RSS at most a third of "+p+"'s", process, targetRSSFraction)
	}
	rateVsN1Row(b, r, n, KP, targetDataPathRatio, "")
	b.WriteString("\n")
}

// writeIPTablesTargets judges issue 13's targets (set for targetN) at n,
// for kp's iptables mode against upstream's through one backend: kp
// (kp-iptables or kp-iptables-legacy) against up (upstream-iptables or
// upstream-iptables-legacy).
func writeIPTablesTargets(b *strings.Builder, r *Results, n int, kp, up string) {
	fmt.Fprintf(b, "## Targets (issue 13: %s against %s, set for N = %s), judged at N = %s\n\n",
		kp, up, fmtN(targetN), fmtN(n))
	b.WriteString("| target | measured | |\n|---|---|---|\n")
	upName := "upstream iptables mode"
	if isIPTablesLegacy(up) {
		upName += " through iptables-legacy"
	}
	coldStartRow(b, r, n, kp, up, upName, iptTargetSpeedup)
	ownSyncRow(b, r, n, kp, up, iptTargetSyncFraction)
	// Upstream's share is shown beside kp's, not judged.
	_, upDesc := r.rateVsN1(up, n)
	rateVsN1Row(b, r, n, kp, iptTargetDataPathRatio, "; "+up+" "+upDesc)
	withChild := func(f FullSync) float64 { return float64(f.PeakRSS + f.ChildRSS) }
	rssRow(b, r, n, kp, up, "peak RSS (process + its iptables-restore child) ≤ "+upName+"'s", withChild, iptTargetRSSFraction)
	b.WriteString("\n")
}

// fmtFraction writes 0.1 as 1/10.
func fmtFraction(f float64) string { return fmt.Sprintf("1/%.0f", 1/f) }
