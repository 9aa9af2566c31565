package bench

import (
	"fmt"
	"strings"
)

// Target of issue 35 for the paths a user hits: each kp mode at least as
// good as upstream's same mode.
const pathTargetRatio = 1.0

// pathTitle names a path in the report.
func pathTitle(path string) string {
	switch path {
	case pathServices:
		return fmt.Sprintf("new TCP connections/s spread over %d Services", pathServiceCount)
	case pathUDP:
		return "UDP request/response exchanges/s through a ClusterIP"
	}
	return "new TCP connections/s to a NodePort from off the node"
}

// writeUserPaths writes the paths' tables: per path its rate, and for the
// TCP paths the connect latency's p50 and p99, each with the direct path
// and the paired ratios of the comparisons.
func writeUserPaths(b *strings.Builder, r *Results) {
	if len(r.UserPaths) == 0 {
		return
	}
	b.WriteString("## Data path a user hits: many Services, UDP, NodePort\n\n")
	b.WriteString("Measured in the data path's rounds, in the same rotation, each window after a conntrack flush, from the\n")
	b.WriteString("client namespace (linked to the node by a veth, as another machine would be). **Services**: each new TCP\n")
	fmt.Fprintf(b, "connection goes to the next of up to %d Services drawn at random for the N with the run's seed (every\n", pathServiceCount)
	b.WriteString("Service at N below that), whose endpoints are the world's pods; a window lasts at least until each has had\n")
	b.WriteString("a connection. Latency: connect() start to established, per connection; p50 and p99 of the window, median\n")
	b.WriteString("of the windows. **UDP**: one datagram and its echo per exchange, each from a new socket, through Service\n")
	b.WriteString("`udp`'s ClusterIP. **NodePort**: new TCP connections to the node's address at Service `nodeport`'s\n")
	b.WriteString("NodePort. \"none\" is the same load straight to a pod. Ratios: the geometric mean of the round-by-round\n")
	b.WriteString("ratios, kp mode over upstream's (rates: above 1 is better for kp; latencies: below 1).\n\n")
	for _, u := range r.UserPaths {
		if u.Path == pathServices && u.Seed != 0 {
			fmt.Fprintf(b, "Seed of the choice of Services: %d (results.json, `UserPaths[].Seed`).\n\n", u.Seed)
			break
		}
	}
	for _, path := range userPaths {
		pathTable(b, r, path, "per second", fmtRate, perSec)
		if path != pathUDP {
			pathTable(b, r, path, "connect latency p50", fmtSeconds, p50Of)
			pathTable(b, r, path, "connect latency p99", fmtSeconds, p99Of)
		}
	}
}

// pathTable writes one figure of path by N: none, each proxy, each
// comparison paired by round, the windows and the failed attempts.
func pathTable(b *strings.Builder, r *Results, path, what string, format func(float64) string, value func(UserPath) float64) {
	proxies, pairs := r.proxies(), r.comparisons()
	fmt.Fprintf(b, "**%s: %s (median of the windows)**\n\n", pathTitle(path), what)
	tableHead(b, append(append(append([]string{"N", "none"}, proxies...), stringsOf(pairs)...), "windows", "failed"))
	for _, n := range r.sortedNs() {
		direct := r.userPathsOf(path, NoProxy, n, value)
		row, runs, failed := []string{fmtN(n), format(Median(direct.values()))}, len(direct), 0
		for _, p := range append([]string{NoProxy}, proxies...) {
			v := r.userPathsOf(path, p, n, value)
			if p != NoProxy {
				row = append(row, format(Median(v.values())))
			}
			runs = max(runs, len(v))
			errs, _ := r.pathErrors(path, p, n)
			failed += errs
		}
		if runs == 0 {
			continue
		}
		for _, c := range pairs {
			row = append(row, fmtRatio(ratio(r.userPathsOf(path, c.kp, n, value), r.userPathsOf(path, c.upstream, n, value)).Mid))
		}
		tableRow(b, append(row, fmt.Sprint(runs), fmt.Sprint(failed)))
	}
	b.WriteString("\n")
}

// writeUserPathTargets judges issue 35's targets of the paths at n: each
// kp mode against upstream's same mode, where the run measured both.
func writeUserPathTargets(b *strings.Builder, r *Results, n int) {
	var pairs []comparison
	for _, c := range []comparison{{KP, UpstreamNFT}, {KPIPTables, UpstreamIPTables}, {KPIPVS, UpstreamIPVS}} {
		if r.has(c.kp, n) && r.has(c.upstream, n) {
			pairs = append(pairs, c)
		}
	}
	if len(pairs) == 0 || !hasUserPaths(r, n) {
		return
	}
	fmt.Fprintf(b, "## Targets (issue 35: the data path a user hits), judged at N = %s\n\n", fmtN(n))
	b.WriteString("| target | measured | |\n|---|---|---|\n")
	for _, c := range pairs {
		for _, path := range userPaths {
			pathRow(b, r, n, c, path, "", perSec, atLeastTarget)
			if path == pathServices {
				pathRow(b, r, n, c, path, "connect latency p50", p50Of, atMostTarget)
				pathRow(b, r, n, c, path, "connect latency p99", p99Of, atMostTarget)
			}
		}
	}
	b.WriteString("\n")
}

func hasUserPaths(r *Results, n int) bool {
	for _, u := range r.UserPaths {
		if u.N == n {
			return true
		}
	}
	return false
}

// pathRow judges one figure of path, c.kp over c.upstream round by round:
// a rate at least pathTargetRatio× upstream's (atLeastTarget), a latency
// at most (atMostTarget). A proxy whose windows all failed, or that timed
// out, makes the row a miss.
func pathRow(b *strings.Builder, r *Results, n int, c comparison, path, what string, value func(UserPath) float64, dir direction) {
	k, u := r.userPathsOf(path, c.kp, n, value), r.userPathsOf(path, c.upstream, n, value)
	iv := ratio(k, u)
	title := fmt.Sprintf("%s: %s ≥ %.1f× %s's", c.kp, pathTitle(path), pathTargetRatio, c.upstream)
	format := fmtRate
	if dir == atMostTarget {
		title = fmt.Sprintf("%s: %s of new TCP connections over %d Services ≤ %.1f× %s's", c.kp, what, pathServiceCount,
			pathTargetRatio, c.upstream)
		format = fmtSeconds
	}
	kErr, kCount := r.pathErrors(path, c.kp, n)
	uErr, uCount := r.pathErrors(path, c.upstream, n)
	measured := fmt.Sprintf("%s %s, %s %s (medians; failed %d of %d and %d of %d); %s / %s by round: %s",
		c.kp, format(Median(k.values())), c.upstream, format(Median(u.values())), kErr, kErr+kCount, uErr, uErr+uCount,
		c.kp, c.upstream, iv)
	var whys []string
	for _, p := range []struct {
		proxy     string
		errs, got int
	}{{c.kp, kErr, kCount}, {c.upstream, uErr, uCount}} {
		if p.got == 0 && p.errs > 0 {
			whys = append(whys, fmt.Sprintf("every attempt through %s failed", p.proxy))
		}
	}
	judgeRow(b, title, measured, iv, dir, pathTargetRatio, append(whys, r.timedOut(c.kp, n), r.timedOut(c.upstream, n))...)
}
