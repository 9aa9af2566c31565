package bench

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// Target values from issue 35 (programming latency under churn), judged
// in the report at every N with churn phases.
const (
	churnTargetRate        = 200.0    // changes a second the latency target is set for
	churnTargetP99         = 0.050    // seconds: kp's p99, API write to the kernel
	churnTargetP99Fraction = 1.0 / 20 // kp's p99 vs upstream nftables mode's
	churnTargetCPUFraction = 1.0 / 10 // kp's CPU per change vs each upstream mode's
)

// churn is proxy's churn phase at n and rate (nil: none).
func (r *Results) churn(proxy string, n int, rate float64) *Churn {
	for i := range r.Churns {
		if c := &r.Churns[i]; c.Proxy == proxy && c.N == n && c.Rate == rate {
			return c
		}
	}
	return nil
}

// churnRates are the rates of r's churn phases at n, ascending.
func (r *Results) churnRates(n int) []float64 {
	var out []float64
	for _, c := range r.Churns {
		if c.N == n && !slices.Contains(out, c.Rate) {
			out = append(out, c.Rate)
		}
	}
	slices.Sort(out)
	return out
}

// churnNs are the Ns of r's churn phases, ascending.
func (r *Results) churnNs() []int {
	var out []int
	for _, c := range r.Churns {
		if !slices.Contains(out, c.N) {
			out = append(out, c.N)
		}
	}
	slices.Sort(out)
	return out
}

// whyNot says why proxy's phase at n and rate cannot meet a target, if
// it cannot: there is none, a change never reached the kernel (or its
// event was lost), a write was refused, or the proxy's cold start timed
// out.
func (r *Results) whyNot(proxy string, n int, rate float64) string {
	c := r.churn(proxy, n, rate)
	switch {
	case c == nil:
		return cmpOr(r.timedOut(proxy, n), fmt.Sprintf("%s: no churn phase at %s/s", proxy, fmtRateNum(rate)))
	case c.Changes == 0:
		return fmt.Sprintf("%s: no change acknowledged at %s/s", proxy, fmtRateNum(rate))
	case c.Unobserved > 0 || c.ServicesUnobserved > 0:
		return fmt.Sprintf("%s: %d of %d changes and %d of %d new Services not in the kernel within %s of their write",
			proxy, c.Unobserved, c.Changes, c.ServicesUnobserved, c.Services, fmtSeconds(c.Timeout))
	case c.WriteErrors > 0:
		return fmt.Sprintf("%s: %d writes refused by the API server", proxy, c.WriteErrors)
	case c.Overruns > 0:
		return fmt.Sprintf("%s: %d overruns of the event socket", proxy, c.Overruns)
	}
	return ""
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// fmtRateNum writes a churn rate: 200, 12.5.
func fmtRateNum(r float64) string { return strings.TrimSuffix(fmt.Sprintf("%.1f", r), ".0") }

// fmtQ prints a stored quantile: beyond the timeout for a negative one.
func fmtQ(v, timeout float64) string {
	if v < 0 {
		if timeout > 0 {
			return "> " + fmtSeconds(timeout)
		}
		return "> last bucket"
	}
	return fmtSeconds(v)
}

// writeChurnTargets judges issue 35's targets at n: the latency target at
// churnTargetRate (or, in a run without it, the highest rate, which the
// row names), the ratios at every rate.
func writeChurnTargets(b *strings.Builder, r *Results, n int) {
	rates := r.churnRates(n)
	if len(rates) == 0 {
		return
	}
	fmt.Fprintf(b, "## Targets (issue 35: programming latency under churn), judged at N = %s\n\n", fmtN(n))
	b.WriteString("| target | measured | |\n|---|---|---|\n")
	at := rates[len(rates)-1]
	if slices.Contains(rates, churnTargetRate) {
		at = churnTargetRate
	}
	what := fmt.Sprintf("%s's p99, API write to the kernel, ≤ %s at %s changes/s", KP, fmtSeconds(churnTargetP99), fmtRateNum(at))
	if at != churnTargetRate {
		what += fmt.Sprintf(" (set for %s/s; this run's highest rate)", fmtRateNum(churnTargetRate))
	}
	var iv Interval
	measured := "no churn phase"
	if k := r.churn(KP, n, at); k != nil {
		iv = k.Latency.p99Interval()
		measured = fmt.Sprintf("p99 %s, 95%% interval %s–%s (order statistics of %d changes)", fmtQ(k.Latency.P99, k.Timeout),
			fmtQ(k.Latency.P99Lo, k.Timeout), fmtQ(k.Latency.P99Hi, k.Timeout), k.Latency.Count)
	}
	judgeRow(b, what, measured, iv, atMostTarget, churnTargetP99, r.whyNot(KP, n, at))
	for _, rate := range rates {
		k, u := r.churn(KP, n, rate), r.churn(UpstreamNFT, n, rate)
		iv, measured := Interval{Mid: math.NaN()}, "not measured"
		upWhy := r.whyNot(UpstreamNFT, n, rate)
		if k != nil && u != nil {
			var bounded bool
			iv, bounded = p99RatioOrBound(k.Latency, u.Latency, u.Timeout)
			measured = fmt.Sprintf("%s %s vs %s %s; ratio %s, 95%% interval %s–%s (from the 97.5%% intervals of each p99)",
				KP, fmtQ(k.Latency.P99, k.Timeout), UpstreamNFT, fmtQ(u.Latency.P99, u.Timeout), fmtRatio(iv.Mid),
				fmtRatio(iv.Lo), fmtRatio(iv.Hi))
			if bounded {
				// Upstream's falling behind is what bounds the ratio, not
				// a reason the row cannot be judged.
				measured = fmt.Sprintf("%s %s vs %s beyond the %s timeout (even at the low end of its interval: %s); "+
					"ratio at most %s, 95%% interval 0–%s", KP, fmtQ(k.Latency.P99, k.Timeout), UpstreamNFT,
					fmtSeconds(u.Timeout), upWhy, fmtRatio(iv.Mid), fmtRatio(iv.Hi))
				upWhy = ""
			}
		}
		judgeRow(b, fmt.Sprintf("%s's p99 ≤ %s of %s's at %s changes/s", KP, fmtFraction(churnTargetP99Fraction), UpstreamNFT,
			fmtRateNum(rate)), measured, iv, atMostTarget, churnTargetP99Fraction, r.whyNot(KP, n, rate), upWhy)
		for _, up := range []string{UpstreamNFT, UpstreamIPTables} {
			cpuRow(b, r, n, rate, up)
		}
	}
	b.WriteString("\n")
}

// cpuRow judges "kp's CPU per change ≤ 1/10 of up's" at rate on the tenths
// of the two phases (the interval of the ratio of their means,
// ratioOfMeans: the phases ran minutes apart, nothing pairs them).
func cpuRow(b *strings.Builder, r *Results, n int, rate float64, up string) {
	k, u := r.churn(KP, n, rate), r.churn(up, n, rate)
	iv, measured := Interval{Mid: math.NaN()}, "not measured"
	if k != nil && u != nil {
		iv = ratioOfMeans(k.CPUWindows, u.CPUWindows)
		measured = fmt.Sprintf("%s %s, %s %s a change over the phase (ratio %s); by tenths of the phases: %s, 95%% interval %s–%s "+
			"(%d and %d tenths, unpaired)", KP, fmtSeconds(k.CPUPerChange), up, fmtSeconds(u.CPUPerChange),
			fmtRatio(k.CPUPerChange/u.CPUPerChange), fmtRatio(iv.Mid), fmtRatio(iv.Lo), fmtRatio(iv.Hi), len(k.CPUWindows), len(u.CPUWindows))
	}
	judgeRow(b, fmt.Sprintf("%s's CPU per change ≤ %s of %s's at %s changes/s", KP, fmtFraction(churnTargetCPUFraction), up,
		fmtRateNum(rate)), measured, iv, atMostTarget, churnTargetCPUFraction, r.whyNot(KP, n, rate), r.whyNot(up, n, rate))
}

// writeChurn writes the churn phases, a row per N, rate and proxy, the
// proxies of one rate next to each other.
func writeChurn(b *strings.Builder, r *Results) {
	b.WriteString("## Churn: programming latency under steady change (issue 35)\n\n")
	b.WriteString("After its endpoint changes, each proxy (one after the other, the others stopped) gets one phase per rate:\n")
	b.WriteString("EndpointSlice writes at a fixed rate from a clock (open loop: a slow proxy does not slow the load), each\n")
	b.WriteString("replacing one endpoint of a Service with a new address, as a rolling update does, plus one Service created\n")
	b.WriteString("a second, each deleted once it has lived the timeout. A change is timed from its API write being sent to the first nf_tables event in\n")
	b.WriteString("the proxy's namespace (a new rule or set element, sent by the kernel at the transaction's commit) that\n")
	b.WriteString("holds its new address: observed from outside the proxy, for the iptables mode too (iptables-nft). A change\n")
	b.WriteString("no event named within the timeout counts as beyond it, and fails the proxy's rows. The proxy's own\n")
	b.WriteString("`kubeproxy_network_programming_duration_seconds` is the growth of its buckets over the phase,\n")
	b.WriteString("**interpolated within a bucket** (its buckets are 0, 0.25, 0.5, 1, 2, … s). CPU: the process's user+system\n")
	b.WriteString("time with its reaped children (upstream's nft and iptables-restore), over the phase and its drain,\n")
	b.WriteString("per EndpointSlice change; its interval from the tenths of the phase (the ratio of their means). p99\n")
	b.WriteString("intervals: order statistics (distribution-free, 95 %). See NOTES.md.\n\n")
	if len(r.Churns) == 0 {
		b.WriteString("(not measured)\n\n")
		return
	}
	tableHead(b, []string{"N", "changes/s", "proxy", "changes (unobserved)", "write → kernel p50", "p99 (95 % interval)", "p99.9",
		"max", "own histogram p50 / p99 / p99.9 (interpolated)", "new Service → kernel p50 / p99", "CPU per change", "CPU", "lag"})
	for _, n := range r.churnNs() {
		for _, rate := range r.churnRates(n) {
			for _, p := range Proxies {
				c := r.churn(p, n, rate)
				if c == nil {
					continue
				}
				q, h, s, to := c.Latency, c.Programming, c.ServiceLatency, c.Timeout
				tableRow(b, []string{fmtN(n), fmtRateNum(rate), p, fmt.Sprintf("%d (%d)", c.Changes, c.Unobserved),
					fmtQ(q.P50, to), fmt.Sprintf("%s (%s–%s)", fmtQ(q.P99, to), fmtQ(q.P99Lo, to), fmtQ(q.P99Hi, to)),
					fmtQ(q.P999, to), fmtQ(q.Max, to),
					fmt.Sprintf("%s / %s / %s (%.0f)", fmtQ(h.P50, 0), fmtQ(h.P99, 0), fmtQ(h.P999, 0), c.ProgrammingCount),
					fmt.Sprintf("%s / %s (%d, %d unobserved)", fmtQ(s.P50, to), fmtQ(s.P99, to), c.Services, c.ServicesUnobserved),
					fmtSeconds(c.CPUPerChange), fmtSeconds(c.CPUSeconds), fmtSeconds(c.Lag)})
			}
		}
	}
	b.WriteString("\n")
}
