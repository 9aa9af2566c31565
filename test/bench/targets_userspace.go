package bench

import (
	"fmt"
	"strings"
)

// Target values from issue 16 (kp's userspace mode), judged in the report.
const (
	usTargetRateFraction = 0.5 // new connections/s vs kp's nftables mode, same N
	usTargetBulkFraction = 0.8 // one long connection's throughput vs direct
)

// writeUserspaceTargets judges issue 16's targets at n and reports its
// cold start with the process's descriptors and RSS.
func writeUserspaceTargets(b *strings.Builder, r *Results, n int) {
	at := "N = 1"
	if n != 1 {
		at += " and N = " + fmtN(n)
	}
	fmt.Fprintf(b, "## Targets (issue 16: %s, judged at %s)\n\n", KPUserspace, at)
	b.WriteString("| target | measured | |\n|---|---|---|\n")
	for _, at := range []int{1, n} {
		us, kp := r.rates(KPUserspace, at), r.rates(KP, at)
		iv := ratio(us, kp)
		judgeRow(b, fmt.Sprintf("new connections per second at N = %s at least %.0f%% of %s's", fmtN(at), usTargetRateFraction*100, KP),
			fmt.Sprintf("%s vs %s (medians); by round: %s", fmtRate(Median(us.values())), fmtRate(Median(kp.values())), iv),
			iv, atLeastTarget, usTargetRateFraction, r.timedOut(KPUserspace, at), r.timedOut(KP, at))
		if at == n {
			break
		}
	}
	us, direct := r.bulks(KPUserspace, n), r.bulks(NoProxy, n)
	iv := ratio(us, direct)
	judgeRow(b, fmt.Sprintf("one long TCP connection at least %.0f%% of direct", usTargetBulkFraction*100),
		fmt.Sprintf("%s vs %s MB/s (medians); by round: %s", fmtMBps(Median(us.values())), fmtMBps(Median(direct.values())), iv),
		iv, atLeastTarget, usTargetBulkFraction, r.timedOut(KPUserspace, n))
	// Reported, not compared: met when every cold start finished, a miss
	// when one timed out or programmed nothing.
	cold := r.coldStarts(KPUserspace, n, seconds)
	fds := Median(r.coldStarts(KPUserspace, n, func(f FullSync) float64 { return float64(f.FDs) }).values())
	rss := Median(r.coldStarts(KPUserspace, n, func(f FullSync) float64 { return float64(f.PeakRSS) }).values())
	v := unmeasured
	if len(cold) > 0 {
		v = met
	}
	measured := fmt.Sprintf("%s (median of %d); %s descriptors; peak RSS %s", fmtSeconds(Median(cold.values())), len(cold),
		fmtCount(fds), fmtBytes(rss))
	if why := r.timedOut(KPUserspace, n); why != "" {
		v, measured = missed, measured+"; "+why
	}
	targetRow(b, fmt.Sprintf("cold start at N = %s reported, with the process's descriptors and RSS", fmtN(n)), measured, v)
	b.WriteString("\n")
}
