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
		us, kp := Median(r.dataPath(KPUserspace, at)), Median(r.dataPath(KP, at))
		targetRow(b, fmt.Sprintf("new connections per second at N = %s at least %.0f%% of %s's", fmtN(at), usTargetRateFraction*100, KP),
			fmt.Sprintf("%s vs %s: %s", fmtRate(us), fmtRate(kp), fmtPercent(us/kp)),
			judge(us/kp >= usTargetRateFraction, known(us, kp)))
		if at == n {
			break
		}
	}
	us, direct := Median(r.bulk(KPUserspace, n)), Median(r.bulk(NoProxy, n))
	targetRow(b, fmt.Sprintf("one long TCP connection at least %.0f%% of direct", usTargetBulkFraction*100),
		fmt.Sprintf("%s vs %s MB/s: %s", fmtMBps(us), fmtMBps(direct), fmtPercent(us/direct)),
		judge(us/direct >= usTargetBulkFraction, known(us, direct)))
	cold, bound := r.coldStart(KPUserspace, n)
	fds := Median(r.fullSync(KPUserspace, n, func(f FullSync) float64 { return float64(f.FDs) }))
	rss := Median(r.fullSync(KPUserspace, n, func(f FullSync) float64 { return float64(f.PeakRSS) }))
	v := unmeasured
	if known(cold) {
		v = met // a report, not a bound
	}
	targetRow(b, fmt.Sprintf("cold start at N = %s reported, with the process's descriptors and RSS", fmtN(n)),
		fmt.Sprintf("%s; %s descriptors; peak RSS %s", atLeast(fmtSeconds(cold), bound), fmtCount(fds), fmtBytes(rss)), v)
	b.WriteString("\n")
}
