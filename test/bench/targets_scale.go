package bench

import (
	"fmt"
	"slices"
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
	scaleTargetMinN        = targetN // the targets are set for 10,000 and 30,000
	scaleTargetProxy       = UpstreamNFT
)

// writeScaleTargets judges issue 14's targets at n, from the medians.
// Where upstream's cold start ran out of its time limit, its time and its
// peak so far are lower bounds, and a row they do not settle is undecided.
func writeScaleTargets(b *strings.Builder, r *Results, n int) {
	up := scaleTargetProxy
	fmt.Fprintf(b, "## Targets (issue 14: %s at scale against %s), judged at N = %s\n\n", KP, up, fmtN(n))
	b.WriteString("| target | measured | |\n|---|---|---|\n")

	coldStartRow(b, r, n, KP, up, up, scaleTargetSpeedup)

	inc := Median(slices.DeleteFunc(r.incremental(KP, n, func(i Incremental) float64 { return i.SyncSeconds }),
		func(x float64) bool { return x <= 0 }))
	targetRow(b, fmt.Sprintf("one endpoint change: kp's own sync ≤ %s", fmtSeconds(scaleTargetIncremental)),
		fmt.Sprintf("median %s", fmtSeconds(inc)), judge(inc <= scaleTargetIncremental, known(inc)))

	// Peak RSS, the process alone (upstream's nft child is not counted).
	process := func(f FullSync) float64 { return float64(f.PeakRSS) }
	kpRSS := Median(r.fullSync(KP, n, process))
	upRSS, upRSSBound := Median(r.fullSync(up, n, process)), false
	if seen := pick(r.FullSyncs, func(f FullSync) bool { return f.Proxy == up && f.N == n && f.Unfinished }, process); !known(upRSS) && len(seen) > 0 {
		upRSS, upRSSBound = slices.Max(seen), true
	}
	v := judge(kpRSS <= upRSS*scaleTargetRSSFraction, known(kpRSS, upRSS))
	if v == missed && upRSSBound {
		v = undecided
	}
	targetRow(b, fmt.Sprintf("peak RSS (process alone) ≤ ⅓ of %s's", up),
		fmt.Sprintf("%s vs %s (⅓: %s): %s", fmtBytes(kpRSS), atLeast(fmtBytes(upRSS), upRSSBound),
			atLeast(fmtBytes(upRSS*scaleTargetRSSFraction), upRSSBound), fmtRatio(kpRSS/upRSS)), v)

	rss := func(i Idle) float64 { return float64(i.RSS) }
	kpIdle, upIdle := Median(r.idle(KP, n, rss)), Median(r.idle(up, n, rss))
	targetRow(b, fmt.Sprintf("idle RSS after the sync ≤ ⅓ of %s's", up),
		fmt.Sprintf("%s vs %s (⅓: %s): %s", fmtBytes(kpIdle), fmtBytes(upIdle), fmtBytes(upIdle*scaleTargetRSSFraction),
			fmtRatio(kpIdle/upIdle)),
		judge(kpIdle <= upIdle*scaleTargetRSSFraction, known(kpIdle, upIdle)))

	// New connections/s against upstream's at every N up to n where both
	// were measured.
	var parts []string
	v = unmeasured
	for _, at := range r.sortedNs() {
		if at > n {
			break
		}
		k, u := Median(r.dataPath(KP, at)), Median(r.dataPath(up, at))
		if !known(k, u) {
			if known(k) {
				parts = append(parts, fmt.Sprintf("N = %s: %s, %s not measured", fmtN(at), fmtRate(k), up))
			}
			continue
		}
		parts = append(parts, fmt.Sprintf("N = %s: %s vs %s, %s", fmtN(at), fmtRate(k), fmtRate(u), fmtRatio(k/u)))
		if k/u < scaleTargetRateRatio {
			v = missed
		} else if v == unmeasured {
			v = met
		}
	}
	targetRow(b, fmt.Sprintf("new connections/s through one ClusterIP ≥ %.1f× %s's at every N", scaleTargetRateRatio, up),
		strings.Join(parts, "; "), v)

	share, desc := r.rateVsN1(KP, n)
	targetRow(b, fmt.Sprintf("kp's new connections/s at N = %s ≥ %.0f%% of N = 1", fmtN(n), scaleTargetRateAtN*100),
		desc, judge(share >= scaleTargetRateAtN, known(share) && n > 1))
	b.WriteString("\n")
}
