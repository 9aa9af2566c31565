package bench

import (
	"fmt"
	"slices"
	"strings"
)

// Restart is one start of a proxy over the table its previous process
// left (issue 35, item 4): how a node's proxy comes back after a rolling
// update of its DaemonSet or a crash. Timed as a cold start is, from the
// new process's start to its first sync after which the kernel holds every
// Service; Client is what a client of the node saw across the restart
// (restart_test.go).
type Restart struct {
	Mark
	Proxy string
	N     int
	// Signal ends a restarted process ("SIGTERM": a DaemonSet's rolling
	// update; "SIGKILL": a crash): the window of Client holds this
	// process's start and its end by Signal, and the table it started over
	// was left by the previous round's process ended the same way (in the
	// first round, by the process stopped with SIGTERM after the data path).
	Signal     string
	Seconds    float64 // start to the first sync holding every Service
	CPUSeconds float64 // of that start, with reaped children
	PeakRSS    int64   // bytes, VmHWM of the new process at its first sync
	ChildRSS   int64   // bytes, largest VmHWM seen of a child
	Unfinished bool    `json:",omitempty"` // no such sync within the cold start's limit; Seconds is the limit
	Client     SwitchClient
}

// TakeOver is one start of a kp mode (Proxy) over the rules an upstream
// kube-proxy (From) left when it was stopped, as a DaemonSet switch leaves
// them: kp's first sync and its removal of upstream's rules, with the
// reference of kp's cold start in the same world and round.
type TakeOver struct {
	Mark
	Proxy, From string
	N           int
	Seconds     float64 // kp's start to its first sync holding every Service
	CPUSeconds  float64
	PeakRSS     int64
	ChildRSS    int64
	Unfinished  bool `json:",omitempty"`
	// Cleared is kp's start to the first listing of the namespace without
	// any of upstream's rules (seconds); Leftovers what was still there
	// when the wait for that ended (its table kube-proxy in ip or ip6,
	// KUBE-* chains of any iptables flavor and family): none is the target.
	Cleared   float64
	Leftovers []string `json:",omitempty"`
	// Kept are kubelet's chains among them (KUBE-FIREWALL, which upstream's
	// iptables mode writes a copy of): kp keeps them, they are kubelet's on
	// a node; shown, not judged.
	Kept   []string `json:",omitempty"`
	Client SwitchClient
	// Cold is kp's cold start in the same world right after, the
	// namespace emptied first: the reference of the round.
	ColdSeconds, ColdCPUSeconds float64
	ColdPeakRSS, ColdChildRSS   int64
}

// SwitchClient is what one client saw across a restart or a take-over:
// new TCP connections to the sampled ClusterIPs one after the other, each
// failed one counted (an error, a wrong answer, a SYN the kernel had to
// send again: netns.Loop), and one long-lived connection to Service bulk
// that sends throughout and must end with the sink counting every byte.
type SwitchClient struct {
	Attempts, Failed int
	Failures         []string `json:",omitempty"` // the first few
	Seconds          float64  // the client's window
	// LongLived is why the long-lived connection broke, "" when it held;
	// LongLivedBytes what it sent, LongLivedRetransmits the segments its
	// kernel sent again (TCP_INFO).
	LongLived            string `json:",omitempty"`
	LongLivedBytes       int64
	LongLivedRetransmits uint32 `json:",omitempty"`
}

// ok says whether the client saw nothing fail.
func (s SwitchClient) ok() bool { return s.Failed == 0 && s.LongLived == "" }

// String is the client's line in the log and the report.
func (s SwitchClient) String() string {
	long := "the long-lived connection held"
	if s.LongLived != "" {
		long = "the long-lived connection broke: " + s.LongLived
	}
	return fmt.Sprintf("%d of %d new connections failed over %.1f s; %s", s.Failed, s.Attempts, s.Seconds, long)
}

// restarts are proxy's finished restarts at n by round.
func (r *Results) restarts(proxy string, n int, value func(Restart) float64) byRound {
	return roundsOf(r.Restarts, func(x Restart) bool { return x.Proxy == proxy && x.N == n && !x.Unfinished }, value)
}

// restartsAt and takeOversAt are the records of n.
func (r *Results) restartsAt(proxy string, n int) []Restart {
	return slices.DeleteFunc(slices.Clone(r.Restarts), func(x Restart) bool { return x.Proxy != proxy || x.N != n })
}

func (r *Results) takeOversAt(proxy, from string, n int) []TakeOver {
	return slices.DeleteFunc(slices.Clone(r.TakeOvers), func(x TakeOver) bool { return x.Proxy != proxy || x.From != from || x.N != n })
}

// restartMarks hands every restart and take-over record to check
// (Results.oneRun).
func (r *Results) restartMarks(check func(kind, proxy string, n int, m Mark)) {
	for _, x := range r.Restarts {
		check("restart", x.Proxy, x.N, x.Mark)
	}
	for _, x := range r.TakeOvers {
		check("take-over", x.Proxy, x.N, x.Mark)
	}
}

// restartNs are the Ns with restart or take-over records, in order.
func (r *Results) restartNs() []int {
	var ns []int
	for _, x := range r.Restarts {
		ns = append(ns, x.N)
	}
	for _, x := range r.TakeOvers {
		ns = append(ns, x.N)
	}
	slices.Sort(ns)
	return slices.Compact(ns)
}

// clientSum sums the client's rounds: new connections failed of
// attempted, and long-lived connections broken of held.
func clientSum(cs []SwitchClient) (failed, attempts, broken int) {
	for _, c := range cs {
		failed, attempts = failed+c.Failed, attempts+c.Attempts
		if c.LongLived != "" {
			broken++
		}
	}
	return failed, attempts, broken
}

// clientCell is clientSum as two cells of a table row.
func clientCell(cs []SwitchClient) string {
	failed, attempts, broken := clientSum(cs)
	return fmt.Sprintf("%d of %d | %d of %d", failed, attempts, broken, len(cs))
}

// writeRestarts writes the restart and take-over tables (issue 35, item 4).
func writeRestarts(b *strings.Builder, r *Results) {
	if len(r.Restarts)+len(r.TakeOvers) == 0 {
		return
	}
	b.WriteString("## Restart over a live table, and take-over from upstream (issue 35, item 4)\n\n")
	b.WriteString("Restart: a new process of the proxy is started over the table its previous one left, and timed from its start to\n")
	b.WriteString("its first sync holding every Service, as a cold start is; then it is ended (the signal column) over that table for\n")
	b.WriteString("the next round (the first round's table: the process stopped with SIGTERM after the data path).\n")
	b.WriteString("Take-over: upstream kube-proxy's process is stopped (SIGTERM) over its rules, and a kp mode started there; time\n")
	b.WriteString("to kp's first sync, to the first listing without any of upstream's rules, and kp's cold start in the same world\n")
	b.WriteString("and round (the namespace emptied first). A client opens new connections to the sampled ClusterIPs throughout\n")
	b.WriteString("and keeps one long-lived connection to Service bulk; failed: an error, a wrong answer or a SYN sent again;\n")
	b.WriteString("the long-lived connection breaks when the sink does not count every byte it sent. Medians over the rounds.\n")
	b.WriteString("Upstream's iptables mode also writes a copy of kubelet's `KUBE-FIREWALL` (and its jumps from INPUT and OUTPUT);\n")
	b.WriteString("kp keeps kubelet's chains, so they are counted apart, not as leftovers.\n\n")
	b.WriteString("| N | proxy | signal | rounds | first sync | peak RSS (+ child) | new connections failed | long-lived broken |\n")
	b.WriteString("|---:|---|---|---:|---:|---:|---:|---:|\n")
	for _, n := range r.restartNs() {
		for _, p := range Proxies {
			xs := r.restartsAt(p, n)
			if len(xs) == 0 {
				continue
			}
			secs := r.restarts(p, n, func(x Restart) float64 { return x.Seconds }).values()
			rss := r.restarts(p, n, func(x Restart) float64 { return float64(x.PeakRSS) }).values()
			child := r.restarts(p, n, func(x Restart) float64 { return float64(x.ChildRSS) }).values()
			var cs []SwitchClient
			for _, x := range xs {
				cs = append(cs, x.Client)
			}
			first := fmtSeconds(Median(secs))
			if len(secs) < len(xs) {
				first += fmt.Sprintf(" (%d unfinished)", len(xs)-len(secs))
			}
			fmt.Fprintf(b, "| %s | %s | %s | %d | %s | %s (+ %s) | %s |\n", fmtN(n), p, xs[0].Signal, len(xs), first,
				fmtBytes(Median(rss)), fmtBytes(Median(child)), clientCell(cs))
		}
	}
	b.WriteString("\n| N | kp mode | over | rounds | first sync | upstream's rules gone | peak RSS (+ child) | its cold start, same rounds | new connections failed | long-lived broken | leftovers |\n")
	b.WriteString("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, n := range r.restartNs() {
		for _, to := range takeOvers {
			xs := r.takeOversAt(to.by, to.from, n)
			if len(xs) == 0 {
				continue
			}
			var secs, cleared, rss, child, cold []float64
			var cs []SwitchClient
			var left []string
			kept := 0
			for _, x := range xs {
				kept = max(kept, len(x.Kept))
				if !x.Unfinished {
					secs, rss, child = append(secs, x.Seconds), append(rss, float64(x.PeakRSS)), append(child, float64(x.ChildRSS))
					cleared, cold = append(cleared, x.Cleared), append(cold, x.ColdSeconds)
				}
				cs, left = append(cs, x.Client), append(left, x.Leftovers...)
			}
			slices.Sort(left)
			leftCell := "none"
			if left = slices.Compact(left); len(left) > 0 {
				leftCell = "**" + strings.Join(left[:min(len(left), 5)], ", ") + "**"
			}
			if kept > 0 {
				leftCell += fmt.Sprintf(" (kubelet's chains kept: %d rules and chains)", kept)
			}
			fmt.Fprintf(b, "| %s | %s | %s | %d | %s | %s | %s (+ %s) | %s | %s | %s |\n", fmtN(n), to.by, to.from, len(xs),
				fmtSeconds(Median(secs)), fmtSeconds(Median(cleared)), fmtBytes(Median(rss)), fmtBytes(Median(child)),
				fmtSeconds(Median(cold)), clientCell(cs), leftCell)
		}
	}
	b.WriteString("\n")
}

// takeOvers are the take-overs measured: each upstream mode by kp's same
// mode family, and upstream's iptables mode by kp's nftables mode too.
var takeOvers = []struct{ from, by string }{{UpstreamNFT, KP}, {UpstreamIPTables, KPIPTables}, {UpstreamIPTables, KP}}

// writeRestartTargets judges issue 35 item 4's targets at n: no failed
// connection across a kp mode's restart or take-over, no upstream rule
// left by a take-over, and a kp mode's restart no slower than upstream's
// same mode's, on the 95 % interval of their ratio paired by round.
func writeRestartTargets(b *strings.Builder, r *Results, n int) {
	if !slices.Contains(r.restartNs(), n) {
		return
	}
	fmt.Fprintf(b, "## Targets (issue 35, item 4: restart and take-over), judged at N = %s\n\n", fmtN(n))
	b.WriteString("| target | measured | |\n|---|---|---|\n")
	clientRow := func(what string, cs []SwitchClient, unfinished int) {
		if len(cs) == 0 {
			return
		}
		v, failed := met, 0
		for _, c := range cs {
			if !c.ok() {
				v, failed = missed, failed+1
			}
		}
		f, a, broken := clientSum(cs)
		measured := fmt.Sprintf("%d of %d rounds saw a failure: %d of %d new connections failed, %d long-lived connections broke",
			failed, len(cs), f, a, broken)
		if unfinished > 0 {
			v, measured = missed, measured+fmt.Sprintf("; %d rounds did not finish their first sync", unfinished)
		}
		targetRow(b, what, measured, v)
	}
	for _, cm := range []comparison{{KP, UpstreamNFT}, {KPIPTables, UpstreamIPTables}, {KP, UpstreamIPTables}} {
		xs := r.restartsAt(cm.kp, n)
		var cs []SwitchClient
		unfinished := 0
		for _, x := range xs {
			if cs = append(cs, x.Client); x.Unfinished {
				unfinished++
			}
		}
		if cm.upstream == UpstreamNFT || cm.kp == KPIPTables {
			clientRow(fmt.Sprintf("no failed connection across a restart of %s", cm.kp), cs, unfinished)
		}
		up := r.restartsAt(cm.upstream, n)
		if len(xs) == 0 || len(up) == 0 {
			continue
		}
		secs := func(x Restart) float64 { return x.Seconds }
		k, u := r.restarts(cm.kp, n, secs), r.restarts(cm.upstream, n, secs)
		iv := ratio(k, u)
		var whys []string
		for _, p := range []string{cm.kp, cm.upstream} {
			if len(r.restarts(p, n, secs)) < len(r.restartsAt(p, n)) {
				whys = append(whys, p+"'s first sync after a restart did not finish in its limit")
			}
		}
		judgeRow(b, fmt.Sprintf("restart: %s's first sync ≤ %s's", cm.kp, cm.upstream),
			fmt.Sprintf("%s %s, %s %s (medians); %s by round: %s", cm.kp, fmtSeconds(Median(k.values())), cm.upstream,
				fmtSeconds(Median(u.values())), cm, iv), iv, atMostTarget, 1, whys...)
	}
	for _, to := range takeOvers {
		xs := r.takeOversAt(to.by, to.from, n)
		if len(xs) == 0 {
			continue
		}
		var cs []SwitchClient
		unfinished, left := 0, 0
		for _, x := range xs {
			if cs = append(cs, x.Client); x.Unfinished {
				unfinished++
			}
			if len(x.Leftovers) > 0 {
				left++
			}
		}
		clientRow(fmt.Sprintf("no failed connection across %s's take-over from %s", to.by, to.from), cs, unfinished)
		v := met
		if left > 0 || unfinished > 0 {
			v = missed
		}
		targetRow(b, fmt.Sprintf("no rule of %s left after %s's take-over", to.from, to.by),
			fmt.Sprintf("%d of %d rounds left some (%d unfinished)", left, len(xs), unfinished), v)
	}
	b.WriteString("\n")
}
