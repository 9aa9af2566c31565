package bench

import (
	"fmt"
	"math"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/test/netns"
)

// participant is one proxy of an N, or one reference of a proxy (a floor:
// its ruleset loaded by its tool), in the N's rounds.
type participant struct {
	name  string
	w     *netns.World
	p     *proxyRun    // a proxy
	owner *participant // a reference: the proxy whose ruleset it loads
	floor *floorLoad   // a reference, once its owner's first cold start finished
	// ready: a proxy one of whose cold starts finished (its references
	// have its ruleset to load).
	ready bool
	// out: no more rounds (a cold start ran into its time limit, a load
	// failed); the report judges a row of a proxy that timed out a miss.
	out bool
}

// refsOf are the references of proxy's cold start.
func refsOf(proxy string) []string {
	switch proxy {
	case KP:
		return []string{floorNFT}
	case KPIPTables:
		return []string{floorIPT, floorIPTNoFlush}
	}
	return nil
}

// rotate is xs begun at its k-th element: round r's order is the first's
// rotated by r-1, so each proxy comes first, second, … as often as the
// others and what drifts within a round does not fall on one proxy only.
// A rotation rather than a shuffle: the first round must measure a proxy
// before its references (they load the ruleset its first cold start
// left), and a rotation needs no seed to be repeated.
func rotate[T any](xs []T, k int) []T {
	if len(xs) == 0 {
		return nil
	}
	k %= len(xs)
	return append(slices.Clone(xs[k:]), xs[:k]...)
}

// limit is the cold-start time limit of who at n.
func (c config) limit(n int) func(who string) time.Duration {
	return func(who string) time.Duration {
		if isProxy(who) && !isKP(who) && c.Big > 0 && n >= c.Big {
			return c.BigTimeout
		}
		return c.SyncTimeout
	}
}

// changesOf is how many endpoint changes proxy gets at n.
func (c config) changesOf(proxy string, n int) int {
	if !isKP(proxy) && c.Big > 0 && n >= c.Big {
		return min(c.Changes, c.BigChanges)
	}
	return c.Changes
}

// perColdStart is what a cold start costs besides itself: the wait for a
// quiet machine, the sampled connections, the idle window, the flush.
func (c config) perColdStart() time.Duration { return 5*time.Second + c.Idle }

// windowBudget is the budget of the data-path (or bulk) rounds of targets
// targets: the rule's cap of rounds of one window each, and a second a
// window for the conntrack flush and the connections' ends.
func (c config) windowBudget(targets int) time.Duration {
	return time.Duration(c.Rule.MaxRounds*targets) * (c.Window + time.Second)
}

// plan is the run's time budget, computed from the rule and the expected
// cold starts before the run, with a line for each N.
func (c config) plan() (time.Duration, []string) {
	var total time.Duration
	var lines []string
	for _, n := range c.Ns {
		var who []string
		proxies := 0 // with a data path: not expected to run into their limit
		for _, p := range c.Proxies {
			if c.measures(p, n) {
				who = append(append(who, p), refsOf(p)...)
				if expectedSeconds(p, n, c.limit(n)(p)) < c.limit(n)(p).Seconds() {
					proxies++
				}
			}
		}
		round, cold := c.Rule.budget(who, n, c.limit(n), c.perColdStart())
		windows := c.windowBudget((proxies + 1) * (2 + c.pathsAt(n))) // data path (with the paths a user hits) and bulk
		var followOn time.Duration
		for _, p := range c.Proxies {
			// A proxy expected to run into its limit has dropped out by
			// then; at N = 1 no change is made.
			sec := expectedSeconds(p, n, c.limit(n)(p))
			if !c.measures(p, n) || sec >= c.limit(n)(p).Seconds() {
				continue
			}
			followOn += time.Duration(sec*float64(time.Second)) + c.perColdStart()
			if n > len(samples(n)) {
				followOn += time.Duration(c.changesOf(p, n)) * 300 * time.Millisecond
			}
			if c.Churn.churns(p, n) {
				// Each phase, its drain (a few seconds when the proxy keeps
				// up) and the watch's probe.
				followOn += time.Duration(len(c.Churn.Rates)) * (c.Churn.Duration + 10*time.Second)
				if c.Churn.MinSyncPeriod.String() != minSyncPeriod {
					followOn += time.Duration(sec * float64(time.Second)) // its restart with the churn's period
				}
			}
		}
		restarts, takeOvers := c.restartBudget(n)
		followOn += restarts + takeOvers
		sum := cold + windows + followOn
		total += sum
		lines = append(lines, fmt.Sprintf("N = %s: a round of cold starts %v (%d at least: %v; up to %d: %v), data path and bulk up to %v, "+
			"the changes, churn phases and their cold starts, restarts and take-overs %v: %v", fmtN(n), round.Round(time.Second), c.Rule.MinRounds,
			(time.Duration(c.Rule.MinRounds)*round).Round(time.Second), c.Rule.MaxRounds, cold.Round(time.Second),
			windows.Round(time.Second), followOn.Round(time.Second), sum.Round(time.Second)))
	}
	return total, lines
}

// widest is the largest half-width of ivs (NaN when there are none: with
// nothing to compare, a phase stops at the rule's minimum).
func widest(ivs []Interval) float64 {
	w := math.NaN()
	for _, iv := range ivs {
		if h := iv.halfWidth(); !(h <= w) {
			w = h
		}
	}
	return w
}

// measureN measures the proxies of cfg at n, each in a world of its own:
//
//  1. Cold starts in rounds: in round r every proxy that has not dropped
//     out and every reference (a kp mode's ruleset loaded by `nft -f` or
//     iptables-nft-restore) is measured once, in an order rotated by r;
//     after its cold start a proxy stays idle for cfg.Idle (measured) and
//     is stopped and flushed, so the next one starts on a quiet machine.
//     The rule adds rounds while a ratio of the round's cold starts is
//     wider than its width (cold starts of two proxies, a proxy's against
//     its floor).
//  2. Each proxy once more, outside the rounds (not recorded as a cold
//     start): its endpoint changes, its churn phases (one per rate, at the
//     Ns of cfg.Churn), then it is halted with its rules in
//     the kernel; kp-userspace, whose data path is its process, last, and
//     left running.
//  3. The data path and the bulk throughput in rounds of one window per
//     proxy and one direct (no proxy), through the rules each proxy left;
//     in the data path's rounds, a window of each path a user hits too
//     (userpath_test.go: many Services, UDP, a NodePort from off the node).
func measureN(t *testing.T, c *cluster, cfg config, n int, res *Results, after func()) {
	id := res.Run.ID
	var parts []*participant
	byName := map[string]*participant{}
	for _, name := range cfg.Proxies {
		if !cfg.measures(name, n) {
			continue
		}
		w, node := c.newWorld(t)
		startSink(t, w.Pods()[0].NS)
		x := &participant{name: name, w: w, p: newProxy(t, c, w, node, name)}
		parts, byName[name] = append(parts, x), x
	}
	if len(parts) == 0 {
		return
	}
	for _, x := range slices.Clone(parts) {
		for _, ref := range refsOf(x.name) {
			r := &participant{name: ref, owner: x}
			parts, byName[ref] = append(parts, r), r
		}
	}
	// Service bulk exists before the first cold start, so every proxy
	// programs it with the others.
	bulkAddr := c.pointBulk(parts[0].w.Pods()[0].IP.String())
	var paths *pathSetup // nil: the paths a user hits are not taken at n
	if cfg.pathsAt(n) > 0 {
		paths = newPathSetup(t, c, n, id) // Services udp and nodeport too (userpath_test.go)
	}
	alive := func(name string) bool { x := byName[name]; return x != nil && !x.out }
	limit := cfg.limit(n)

	var names []string
	for _, x := range parts {
		names = append(names, x.name)
	}
	_, budget := cfg.Rule.budget(names, n, limit, cfg.perColdStart())
	stop := coldStartRounds(cfg.Rule, n, budget, time.Now, parts,
		func(x *participant, round int) bool { return coldStartRound(t, c, cfg, n, round, x, res, byName) },
		func(x *participant, round int) error {
			fl, err := x.floor.load(n)
			if err != nil {
				t.Logf("%v: no more %s loads at N = %d", err, x.name, n)
				return err
			}
			res.Floors = append(res.Floors, stamp(id, round, fl)...)
			return nil
		},
		func() float64 {
			after()
			var ivs []Interval
			for _, cm := range comparisons {
				if alive(cm.kp) && alive(cm.upstream) {
					ivs = append(ivs, ratio(res.coldStarts(cm.kp, n, seconds), res.coldStarts(cm.upstream, n, seconds)))
				}
			}
			for _, x := range parts {
				if x.owner != nil && !x.out && !x.owner.out {
					ivs = append(ivs, ratio(res.coldStarts(x.owner.name, n, seconds), res.floors(x.name, n)))
				}
			}
			return widest(ivs)
		})
	t.Logf("%s", stop)
	res.Stops = append(res.Stops, stop)

	// The changes, one proxy after the other; kp-userspace last, since it
	// keeps running and follows every later write to the sampled Services
	// and Service bulk.
	direct := c.directWorld(t)
	rates := []dataPathTarget{{NoProxy, direct, net.JoinHostPort(direct.Pods()[0].IP.String(), fmt.Sprint(podPort))}}
	bulks := []dataPathTarget{{NoProxy, parts[0].w, net.JoinHostPort(parts[0].w.Pods()[0].IP.String(), fmt.Sprint(sinkPort))}}
	svc := net.JoinHostPort(c.clusterIP(0), fmt.Sprint(servicePort))
	order := slices.DeleteFunc(slices.Clone(parts), func(x *participant) bool { return x.owner != nil || x.out })
	slices.SortStableFunc(order, func(a, b *participant) int {
		return boolInt(a.name == KPUserspace) - boolInt(b.name == KPUserspace)
	})
	var running *participant
	for _, x := range order {
		c.pointSamples(x.w, n)
		c.pointBulk(x.w.Pods()[0].IP.String())
		if fs := x.p.coldStart(c, n, limit(x.name)); fs.Unfinished {
			t.Logf("%s N=%d: its cold start for the changes did not finish: no changes, no data path", x.name, n)
			x.p.stop()
			continue
		}
		if n > len(samples(n)) {
			inc := x.p.incremental(c, n, cfg.changesOf(x.name, n), cfg.ChangeTimeout)
			res.Incrementals = append(res.Incrementals, stamp(id, 0, inc...)...)
			logChanges(t, x.name, n, inc)
		}
		if cfg.Churn.churns(x.name, n) {
			churnPhases(t, c, cfg, n, x, res, after)
		}
		paths.ready(x.w, x.name, limit(x.name))
		rates = append(rates, dataPathTarget{x.name, x.w, svc})
		bulks = append(bulks, dataPathTarget{x.name, x.w, bulkAddr})
		if x.name == KPUserspace {
			running = x
			continue
		}
		x.p.halt()
	}
	after()

	measured := func(targets []dataPathTarget) []string {
		var out []string
		for _, tg := range targets {
			out = append(out, tg.proxy)
		}
		return out
	}
	// Intervals the data-path and bulk rounds narrow: each comparison, and
	// each kp mode against the direct path of its round.
	againstDirect := func(of func(string, int) byRound, proxies []string, pairs bool) float64 {
		var ivs []Interval
		for _, p := range proxies {
			if p != NoProxy && (isKP(p) || !pairs) {
				ivs = append(ivs, ratio(of(p, n), of(NoProxy, n)))
			}
		}
		for _, cm := range comparisons {
			if pairs && slices.Contains(proxies, cm.kp) && slices.Contains(proxies, cm.upstream) {
				ivs = append(ivs, ratio(of(cm.kp, n), of(cm.upstream, n)))
			}
		}
		return widest(ivs)
	}
	dp := cfg.Rule.runRounds(n, "data path", cfg.windowBudget(len(rates)*(1+cfg.pathsAt(n))), time.Now, func(round int) float64 {
		for _, tg := range rotate(rates, round-1) {
			res.DataPaths = append(res.DataPaths, stamp(id, round, dataPath(tg.w, tg.proxy, n, tg.addr, cfg))...)
			res.UserPaths = append(res.UserPaths, stamp(id, round, paths.measure(tg, cfg)...)...)
		}
		after()
		return widerOf(againstDirect(res.rates, measured(rates), true), paths.widest(res, measured(rates)))
	})
	t.Logf("%s", dp)
	bk := cfg.Rule.runRounds(n, "bulk", cfg.windowBudget(len(bulks)), time.Now, func(round int) float64 {
		for _, tg := range rotate(bulks, round-1) {
			if b, ok := bulk(t, tg.w, tg.proxy, n, tg.addr, cfg); ok {
				res.Bulks = append(res.Bulks, stamp(id, round, b)...)
			}
		}
		after()
		return againstDirect(res.bulks, measured(bulks), false)
	})
	t.Logf("%s", bk)
	res.Stops = append(res.Stops, dp, bk)
	restartPhases(t, c, cfg, n, parts, res, after)
	if running != nil {
		running.p.stop()
	}
	after()
}

// coldStartRound is proxy x's cold start in round: timed, then idle for
// cfg.Idle (measured), its ruleset listed for its references after its
// first finished cold start, and stopped and flushed for the next one. It
// says whether the cold start finished.
func coldStartRound(t *testing.T, c *cluster, cfg config, n, round int, x *participant, res *Results, refs map[string]*participant) (finished bool) {
	c.pointSamples(x.w, n)
	fs := x.p.coldStart(c, n, cfg.limit(n)(x.name))
	t.Logf("%s N=%d round %d: full sync %.3f s, CPU %.2f s, peak RSS %d MiB (child %d MiB)",
		x.name, n, round, fs.Seconds, fs.CPUSeconds, fs.PeakRSS>>20, fs.ChildRSS>>20)
	res.FullSyncs = append(res.FullSyncs, stamp(res.Run.ID, round, fs)...)
	if fs.Unfinished {
		t.Logf("%s N=%d: its cold start did not finish: no more rounds and no other measure at this N", x.name, n)
		x.p.stop()
		return false
	}
	res.Idles = append(res.Idles, stamp(res.Run.ID, round, x.p.idle(n, cfg.Idle))...)
	for _, f := range x.p.floorLoads(refs) {
		refs[f.ref].floor = f
	}
	x.p.stop()
	return true
}

// coldStartRounds runs the rule's rounds of cold starts over parts, round
// r in their order rotated by r-1: coldStart(x, r) measures proxy x and
// says whether it finished (one that did not drops out: its next cold
// start would run into the same limit); load(x, r) loads reference x, once
// its owner's first cold start finished (an error drops it out); widest,
// after each round, is the widest interval the rule weighs.
func coldStartRounds(rule StopRule, n int, budget time.Duration, now func() time.Time, parts []*participant,
	coldStart func(*participant, int) bool, load func(*participant, int) error, widest func() float64) Stop {
	return rule.runRounds(n, "cold starts", budget, now, func(round int) float64 {
		for _, x := range rotate(parts, round-1) {
			switch {
			case x.out:
			case x.owner != nil && !x.owner.ready:
				x.out = true // its proxy's first cold start did not finish
			case x.owner != nil:
				if load(x, round) != nil {
					x.out = true
				}
			case coldStart(x, round):
				x.ready = true
			default:
				x.out = true
			}
		}
		return widest()
	})
}

// logChanges logs a proxy's endpoint changes at n; the tail is named for
// what it is (Tail).
func logChanges(t *testing.T, proxy string, n int, inc []Incremental) {
	if len(inc) == 0 {
		return
	}
	secs, own := make([]float64, len(inc)), make([]float64, len(inc))
	for i, x := range inc {
		secs[i], own[i] = x.Seconds, x.SyncSeconds
	}
	tail, name := Tail(secs)
	t.Logf("%s N=%d: endpoint change median %.1f ms, %s %.1f ms; the proxy's own sync median %.2f ms",
		proxy, n, Median(secs)*1e3, strings.ToLower(name), tail*1e3, Median(own)*1e3)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
