package bench

import (
	"flag"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/test/netns"
)

// The restart and take-over phases (issue 35, item 4), at the Ns of
// -bench.restart.n, after an N's data path: every proxy then is halted over
// the rules it left.
var (
	flagRestartNs      = flag.String("bench.restart.n", "10000", "comma-separated Ns with the restart and take-over phases (\"\": none)")
	flagRestartProxies = flag.String("bench.restart.proxies", strings.Join([]string{KP, UpstreamNFT, KPIPTables, UpstreamIPTables}, ","),
		"proxies restarted over their own table; the take-overs are those of upstream's modes listed by kp's listed")
	flagRestartSignal = flag.String("bench.restart.signal", "TERM", "how a restart ends the proxy: TERM (a DaemonSet rolling update: "+
		"SIGTERM, the new pod once the old one exited) or KILL (a crash)")
)

// restartConfig shapes the restart and take-over phases.
type restartConfig struct {
	Ns      []int
	Proxies []string
	Kill    bool // SIGKILL rather than SIGTERM
}

func (c restartConfig) at(n int) bool { return slices.Contains(c.Ns, n) }

func (c restartConfig) signal() string {
	if c.Kill {
		return "SIGKILL"
	}
	return "SIGTERM"
}

// restartFlags reads the -bench.restart.* flags.
func restartFlags(t *testing.T) restartConfig {
	c := restartConfig{Ns: serviceCounts(t, "bench.restart.n", *flagRestartNs)}
	for _, p := range strings.Split(*flagRestartProxies, ",") {
		if p = strings.TrimSpace(p); !slices.Contains([]string{KP, UpstreamNFT, KPIPTables, UpstreamIPTables}, p) {
			t.Fatalf("-bench.restart.proxies: %q is not kp, upstream-nft, kp-iptables or upstream-iptables", p)
		}
		c.Proxies = append(c.Proxies, p)
	}
	switch *flagRestartSignal {
	case "TERM":
	case "KILL":
		c.Kill = true
	default:
		t.Fatalf("-bench.restart.signal: %q is neither TERM nor KILL", *flagRestartSignal)
	}
	return c
}

// restartBudget is what the two phases at n are given: the rule's cap of
// rounds, a round of restarts a start of every restarted proxy, a round of
// take-overs, per take-over, upstream's cold start again (the previous
// round's take-over removed its rules) and two of kp's (the take-over and
// its reference), each with the client's window. A proxy expected to run
// into its cold start's limit is left out: its rules are not all in the
// kernel after it, and it has neither phase.
func (c config) restartBudget(n int) (restarts, takeOvers time.Duration) {
	if !c.Restart.at(n) {
		return 0, 0
	}
	exp := func(p string) time.Duration {
		return time.Duration(expectedSeconds(p, n, c.limit(n)(p))*float64(time.Second)) + 3*time.Second
	}
	fits := func(p string) bool {
		return c.measures(p, n) && expectedSeconds(p, n, c.limit(n)(p)) < c.limit(n)(p).Seconds()
	}
	var r, to time.Duration
	for _, p := range c.Restart.Proxies {
		if fits(p) {
			r += exp(p)
		}
	}
	for _, x := range c.takeOvers(n) {
		if fits(x.from) && fits(x.by) {
			to += exp(x.from) + 2*exp(x.by)
		}
	}
	return time.Duration(c.Rule.MaxRounds) * r, time.Duration(c.Rule.MaxRounds) * to
}

// takeOvers are the take-overs measured at n.
func (c config) takeOvers(n int) []struct{ from, by string } {
	var out []struct{ from, by string }
	for _, to := range takeOvers {
		if slices.Contains(c.Restart.Proxies, to.from) && slices.Contains(c.Restart.Proxies, to.by) &&
			slices.Contains(c.Proxies, to.from) && c.measures(to.from, n) && c.measures(to.by, n) {
			out = append(out, to)
		}
	}
	return out
}

// restartPhases runs the restarts at n in rounds, then the take-overs in
// rounds, over the proxies of parts that left all n Services in the kernel.
func restartPhases(t *testing.T, c *cluster, cfg config, n int, parts []*participant, res *Results, after func()) {
	if !cfg.Restart.at(n) {
		return
	}
	var who []*participant
	byName := map[string]*participant{}
	for _, x := range parts {
		if x.owner != nil || !slices.Contains(cfg.Restart.Proxies, x.name) {
			continue
		}
		if count, err := x.p.count(); err != nil || count < n {
			t.Logf("%s N=%d: no restart or take-over: the kernel holds %d of its Services (%v)", x.name, n, count, err)
			continue
		}
		// The churn phases may have restarted it with another period.
		if args := withMinSync(x.p.args, minSync); !slices.Equal(args, x.p.args) {
			x.p.args, x.p.proc = args, nil
		}
		who, byName[x.name] = append(who, x), x
	}
	budget, takeOverBudget := cfg.restartBudget(n)
	out := map[string]bool{}
	stop := cfg.Rule.runRounds(n, "restarts", budget, time.Now, func(round int) float64 {
		for _, x := range rotate(who, round-1) {
			if out[x.name] {
				continue
			}
			r := restartTurn(t, c, cfg, n, x)
			res.Restarts = append(res.Restarts, stamp(res.Run.ID, round, r)...)
			t.Logf("%s N=%d restart %d (ended by %s): first sync %.3f s, peak RSS %d MiB (child %d MiB); %s", x.name, n, round,
				r.Signal, r.Seconds, r.PeakRSS>>20, r.ChildRSS>>20, r.Client)
			for _, f := range r.Client.Failures {
				t.Logf("%s N=%d restart %d: failed: %s", x.name, n, round, f)
			}
			out[x.name] = r.Unfinished
		}
		after()
		var ivs []Interval
		for _, cm := range comparisons {
			if byName[cm.kp] != nil && byName[cm.upstream] != nil {
				secs := func(x Restart) float64 { return x.Seconds }
				ivs = append(ivs, ratio(res.restarts(cm.kp, n, secs), res.restarts(cm.upstream, n, secs)))
			}
		}
		return widest(ivs)
	})
	t.Logf("%s", stop)
	res.Stops = append(res.Stops, stop)
	takeOverRounds(t, c, cfg, n, byName, res, takeOverBudget, after)
}

// restartTurn restarts proxy x over the table it left: the client starts,
// the proxy starts and is timed to its first sync, then it is ended as the
// next restart's predecessor (cfg.Restart's signal) and the client stops.
// The first round's predecessor is the process halted after the data path.
func restartTurn(t *testing.T, c *cluster, cfg config, n int, x *participant) Restart {
	c.pointSamples(x.w, n)
	bulk := c.pointBulk(x.w.Pods()[0].IP.String())
	cl, started := beginSwitch(t, c, n, x.w, bulk, x.name+" restart")
	fs := x.p.firstSync(c, n, cfg.limit(n)(x.name))
	time.Sleep(switchTail)
	if cfg.Restart.Kill {
		x.p.proc.Kill()
	} else {
		x.p.halt()
	}
	time.Sleep(switchTail)
	return Restart{Proxy: x.name, N: n, Signal: cfg.Restart.signal(), Seconds: fs.Seconds, CPUSeconds: fs.CPUSeconds,
		PeakRSS: fs.PeakRSS, ChildRSS: fs.ChildRSS, Unfinished: fs.Unfinished, Client: cl.stop(started)}
}

// beginSwitch waits for a quiet machine, starts the client of a restart or
// take-over (what) in world w and returns it after its lead, with the time
// the switch may begin.
func beginSwitch(t *testing.T, c *cluster, n int, w *netns.World, bulk, what string) (*switchClient, time.Time) {
	if waited := waitQuiet(t, n); waited > time.Second {
		t.Logf("%s N=%d: waited %v for a quiet machine", what, n, waited.Round(100*time.Millisecond))
	}
	cl, err := startSwitchClient(w.Client(), sampleAddrs(c, n), bulk)
	if err != nil {
		t.Fatalf("%s N=%d: %v", what, n, err)
	}
	time.Sleep(switchLead)
	return cl, time.Now()
}

// sampleAddrs are the sampled Services' ClusterIP addresses.
func sampleAddrs(c *cluster, n int) []string {
	var out []string
	for _, i := range samples(n) {
		out = append(out, net.JoinHostPort(c.clusterIP(i), strconv.Itoa(servicePort)))
	}
	return out
}

// minSync is minSyncPeriod as a duration.
var minSync = func() time.Duration { d, _ := time.ParseDuration(minSyncPeriod); return d }()

// takeOverRounds runs the take-overs of cfg at n in rounds, each in the
// world of the upstream proxy taken over.
func takeOverRounds(t *testing.T, c *cluster, cfg config, n int, byName map[string]*participant, res *Results, budget time.Duration, after func()) {
	type pair struct {
		from *participant
		by   *proxyRun
	}
	var pairs []pair
	for _, to := range cfg.takeOvers(n) {
		if x := byName[to.from]; x != nil {
			pairs = append(pairs, pair{x, newProxy(t, c, x.w, nodeName(x.w), to.by)})
		}
	}
	if len(pairs) == 0 {
		return
	}
	out := map[int]bool{}
	stop := cfg.Rule.runRounds(n, "take-overs", budget, time.Now, func(round int) float64 {
		for i, p := range rotate(pairs, round-1) {
			if out[i] {
				continue
			}
			to, ok := takeOverTurn(t, c, cfg, n, p.from, p.by)
			if !ok {
				out[i] = true
				continue
			}
			res.TakeOvers = append(res.TakeOvers, stamp(res.Run.ID, round, to)...)
			t.Logf("%s N=%d take-over %d from %s: first sync %.3f s, upstream's rules gone at %.3f s (left: %v, kubelet's kept: %d), peak RSS %d MiB "+
				"(child %d MiB); its cold start %.3f s; %s", to.Proxy, n, round, to.From, to.Seconds, to.Cleared, to.Leftovers, len(to.Kept),
				to.PeakRSS>>20, to.ChildRSS>>20, to.ColdSeconds, to.Client)
			for _, f := range to.Client.Failures {
				t.Logf("%s N=%d take-over %d from %s: failed: %s", to.Proxy, n, round, to.From, f)
			}
			out[i] = to.Unfinished
		}
		after()
		var ivs []Interval
		for _, p := range pairs {
			k := roundsOf(res.TakeOvers, func(x TakeOver) bool {
				return x.Proxy == p.by.name && x.From == p.from.name && x.N == n && !x.Unfinished
			},
				func(x TakeOver) float64 { return x.Seconds })
			ref := roundsOf(res.TakeOvers, func(x TakeOver) bool {
				return x.Proxy == p.by.name && x.From == p.from.name && x.N == n && !x.Unfinished
			},
				func(x TakeOver) float64 { return x.ColdSeconds })
			ivs = append(ivs, ratio(k, ref))
		}
		return widest(ivs)
	})
	t.Logf("%s", stop)
	res.Stops = append(res.Stops, stop)
}

// nodeName is the Node of world w (newWorld).
func nodeName(w *netns.World) string { return fmt.Sprintf("bench-%d", w.Index()) }
