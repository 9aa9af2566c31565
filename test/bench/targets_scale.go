package bench

import (
	"cmp"
	"fmt"
	"strings"
)

// Target values from issue 14 (kp's nftables mode at scale, against
// upstream's nftables mode), judged in the report from N = targetN on.
const (
	scaleTargetSpeedup     = 10.0    // cold start vs upstream nftables mode
	scaleTargetIncremental = 0.005   // seconds: kp's own sync for one endpoint change
	scaleTargetRSSFraction = 1.0 / 3 // peak and idle RSS, process alone, vs upstream's
	scaleTargetRateRatio   = 1.0     // new connections/s vs upstream's, at every N
	scaleTargetRateAtN     = 0.95    // kp's new connections/s at N vs at N = 1
	scaleTargetMinN        = targetN // the targets are set for 10,000 and 30,000;
	scaleTargetMaxN        = 30000   // at 100,000 kp runs alone (the full tables show it)
	scaleTargetProxy       = UpstreamNFT
)

// writeScaleTargets judges issue 14's targets at n.
func writeScaleTargets(b *strings.Builder, r *Results, n int) {
	up := scaleTargetProxy
	fmt.Fprintf(b, "## Targets (issue 14: %s at scale against %s), judged at N = %s\n\n", KP, up, fmtN(n))
	b.WriteString("| target | measured | |\n|---|---|---|\n")

	coldStartRow(b, r, n, KP, up, up, scaleTargetSpeedup)
	ownSyncUnderRow(b, r, n, KP, scaleTargetIncremental)
	// Peak RSS, the process alone (upstream's nft child is not counted).
	rssRow(b, r, n, KP, up, fmt.Sprintf("peak RSS (process alone) ≤ ⅓ of %s's", up),
		func(f FullSync) float64 { return float64(f.PeakRSS) }, scaleTargetRSSFraction)

	rss := func(i Idle) float64 { return float64(i.RSS) }
	k, u := r.idles(KP, n, rss), r.idles(up, n, rss)
	iv := ratio(k, u)
	judgeRow(b, fmt.Sprintf("idle RSS after the sync ≤ ⅓ of %s's", up),
		fmt.Sprintf("%s vs %s (medians); by round: %s", fmtBytes(Median(k.values())), fmtBytes(Median(u.values())), iv),
		iv, atMostTarget, scaleTargetRSSFraction, r.timedOut(KP, n), r.timedOut(up, n))

	// New connections/s against upstream's at every N up to n: each N's
	// ratio is paired by round, and the row is as good as its worst N.
	var parts []string
	v := unmeasured
	for _, at := range r.sortedNs() {
		if at > n {
			break
		}
		if why := cmp.Or(r.timedOut(KP, at), r.timedOut(up, at)); why != "" {
			parts, v = append(parts, fmt.Sprintf("N = %s: %s", fmtN(at), why)), missed
			continue
		}
		k, u := r.rates(KP, at), r.rates(up, at)
		if len(k) == 0 && len(u) == 0 {
			continue
		}
		iv := ratio(k, u)
		parts = append(parts, fmt.Sprintf("N = %s: %s vs %s (medians), by round %s", fmtN(at), fmtRate(Median(k.values())),
			fmtRate(Median(u.values())), iv))
		v = worse(v, decide(iv, atLeastTarget, scaleTargetRateRatio))
	}
	targetRow(b, fmt.Sprintf("new connections/s through one ClusterIP ≥ %.1f× %s's at every N", scaleTargetRateRatio, up),
		strings.Join(parts, "; "), v)

	rateVsN1Row(b, r, n, KP, scaleTargetRateAtN, "")
	b.WriteString("\n")
}

// worse combines the verdicts of one row's parts: any miss misses, any
// undecided part leaves the row undecided, and unmeasured parts count for
// nothing.
func worse(a, b verdict) verdict {
	for _, v := range []verdict{missed, undecided, met} {
		if a == v || b == v {
			return v
		}
	}
	return unmeasured
}
