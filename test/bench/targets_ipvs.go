package bench

import (
	"fmt"
	"strings"
)

// Target values from issue 15 (kp's ipvs mode against upstream's, in the
// VM, at N = 1,000 and 10,000), judged in the report.
const (
	ipvsTargetSpeedup      = 5.0 // cold start vs upstream ipvs mode
	ipvsTargetSyncFraction = 0.1 // kp's own sync per change vs upstream's
	ipvsTargetRSSFraction  = 1.0 // peak RSS, process and child, vs upstream's
)

// writeIPVSTargets judges issue 15's targets (kp-ipvs against upstream
// ipvs mode) at n.
func writeIPVSTargets(b *strings.Builder, r *Results, n int) {
	fmt.Fprintf(b, "## Targets (issue 15: %s against %s), judged at N = %s\n\n", KPIPVS, UpstreamIPVS, fmtN(n))
	if r.Machine.VM != "" {
		b.WriteString("In a software-emulated VM: the ratios are what count, not the times.\n\n")
	}
	b.WriteString("| target | measured | |\n|---|---|---|\n")
	coldStartRow(b, r, n, KPIPVS, UpstreamIPVS, "upstream ipvs mode", ipvsTargetSpeedup)
	ownSyncRow(b, r, n, KPIPVS, UpstreamIPVS, ipvsTargetSyncFraction)
	withChild := func(f FullSync) float64 { return float64(f.PeakRSS + f.ChildRSS) }
	rssRow(b, r, n, KPIPVS, UpstreamIPVS, "peak RSS (process + its ipset / iptables-restore child) ≤ upstream ipvs mode's",
		withChild, ipvsTargetRSSFraction)
	b.WriteString("\n")
}
