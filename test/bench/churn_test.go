package bench

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// churnConfig shapes the churn phases (issue 35; Churn in churn.go).
type churnConfig struct {
	Ns      []int     // the Ns with churn phases
	Rates   []float64 // EndpointSlice changes a second, one phase each
	Proxies []string  // the proxies with churn phases (of those the run measures)
	// Duration of a phase at each rate; Timeout bounds the wait for one
	// change to reach the kernel, and the drain after the last write.
	Duration, Timeout time.Duration
	// MinSyncPeriod is every proxy's --min-sync-period (upstream's
	// --iptables-min-sync-period) in its churn phases: a proxy whose run
	// started it with another is restarted with this one first. Under
	// churn the limiter, not the proxy, would set the latency: a change
	// waits for the next sync the period allows (NOTES.md).
	MinSyncPeriod time.Duration
	// ProfileDir, when set, gets a CPU profile of each proxy's middle half
	// of each phase (the proxies run with --profiling).
	ProfileDir string
}

// churns says whether proxy has churn phases at n.
func (c churnConfig) churns(proxy string, n int) bool {
	return len(c.Rates) > 0 && c.Duration > 0 && slices.Contains(c.Ns, n) && slices.Contains(c.Proxies, proxy)
}

// churnInFlight bounds the writes in flight: past it a tick waits (and
// the wait shows as Churn.Lag), so a stuck API server cannot pile up
// goroutines without end.
const churnInFlight = 64

// openLoop calls send(k) for k = 0 … rate·d−1, the k-th at start + k/rate,
// each in a goroutine of its own: a tick never waits for an earlier
// send (open loop: a slow proxy or API server does not slow the load),
// only for one of inFlight senders to be free. It returns once every send
// returned, with the largest delay of a tick behind its schedule.
func openLoop(rate float64, d time.Duration, inFlight int, send func(k int)) (lag time.Duration) {
	total := int(math.Floor(rate * d.Seconds()))
	sem := make(chan struct{}, inFlight)
	var wg sync.WaitGroup
	start := time.Now()
	for k := 0; k < total; k++ {
		at := start.Add(time.Duration(float64(k) / rate * float64(time.Second)))
		if wait := time.Until(at); wait > 0 {
			time.Sleep(wait)
		}
		sem <- struct{}{}
		lag = max(lag, time.Since(at))
		wg.Add(1)
		go func(k int) {
			defer func() { <-sem; wg.Done() }()
			send(k)
		}(k)
	}
	wg.Wait()
	return lag
}

// churnLog is what a phase's writers record: the address of each
// acknowledged change, and the errors.
type churnLog struct {
	mu                 sync.Mutex
	changes, services  []netip.Addr
	errs               []error
	acked              atomic.Int64 // EndpointSlice changes acknowledged, for the CPU windows
	endpointWriteFails int
}

func (l *churnLog) add(list *[]netip.Addr, addr netip.Addr, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		if len(l.errs) < 5 {
			l.errs = append(l.errs, err)
		}
		if list == &l.changes {
			l.endpointWriteFails++
		}
		return
	}
	if list == nil {
		return
	}
	*list = append(*list, addr)
	if list == &l.changes {
		l.acked.Add(1)
	}
}

// churn runs one churn phase of proxy p at n: rate EndpointSlice changes a
// second and one Service created a second (each deleted once it has lived
// cfg.Timeout), for cfg.Duration, each change timed to the kernel by a kernelWatch in the
// proxy's namespace, then waits (cfg.Timeout at most) for the changes
// still in flight.
func (p *proxyRun) churn(c *cluster, n int, rate float64, cfg churnConfig) Churn {
	p.t.Helper()
	w, err := watchKernel(p.w.Node(), churnBase.As4()[0])
	if err != nil {
		p.t.Fatalf("%s: watch the kernel's nf_tables events: %v", p.name, err)
	}
	defer w.stop()
	if err := w.probe(p.w.Node()); err != nil {
		p.t.Fatalf("%s: %v", p.name, err)
	}
	const histogram = "kubeproxy_network_programming_duration_seconds"
	before := p.histogram(histogram)
	pid := p.proc.Pid()
	cpu0, err := readProc(pid)
	if err != nil {
		p.t.Fatalf("%s: %v", p.name, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Duration+2*cfg.Timeout)
	defer cancel()
	var log churnLog
	windows := p.cpuWindows(pid, cfg.Duration/10, &log.acked)
	start := time.Now()
	if cfg.ProfileDir != "" {
		go p.profile(filepath.Join(cfg.ProfileDir, fmt.Sprintf("%s-N%d-%s.pprof", p.name, n, fmtRateNum(rate))), cfg.Duration)
	}
	var lag time.Duration
	var live []string // the phase's Services not deleted yet, oldest first
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // one Service created a second, and one deleted once it has lived the timeout
		defer wg.Done()
		// One sender (inFlight 1): the sends run one after the other.
		openLoop(1, cfg.Duration, 1, func(int) {
			name := churnService(c.churnSvcs.Add(1))
			addrs := make([]string, endpointsPer)
			for j := range addrs {
				addrs[j] = c.nextChurnAddr().String()
			}
			first := netip.MustParseAddr(addrs[0])
			w.expect(first, time.Now())
			err := c.createService(ctx, name, addrs)
			if err != nil {
				w.forget(first)
			}
			log.add(&log.services, first, err)
			// A Service lives the timeout: a proxy that syncs every few
			// seconds never programs one deleted sooner, and rightly (the
			// first runs deleted each after 1 s, then 10 s, and counted
			// upstream-nft's as unobserved); one it has not programmed by
			// then is a failure, as a change would be.
			if live = append(live, name); len(live) > int(cfg.Timeout.Seconds()) {
				log.add(nil, netip.Addr{}, c.deleteService(ctx, live[0]))
				live = live[1:]
			}
		})
	}()
	lag = openLoop(rate, cfg.Duration, churnInFlight, func(k int) {
		i, addr := churnTarget(k, n), c.nextChurnAddr()
		addrs := c.rollOne(i, addr)
		w.expect(addr, time.Now())
		err := c.writeSlice(ctx, i, addrs)
		if err != nil {
			w.forget(addr) // not a change: the drain does not wait for it
		}
		log.add(&log.changes, addr, err)
	})
	wg.Wait()
	phase := time.Since(start)
	cpuPer := windows()
	for deadline := time.Now().Add(cfg.Timeout); w.pending() > 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	for _, name := range live {
		log.add(nil, netip.Addr{}, c.deleteService(ctx, name))
	}
	cpu1, err := readProc(pid)
	if err != nil {
		p.t.Fatalf("%s: %v", p.name, err)
	}
	res := Churn{Proxy: p.name, N: n, Rate: rate, Seconds: phase.Seconds(), Timeout: cfg.Timeout.Seconds(), Lag: lag.Seconds(),
		Changes: len(log.changes), WriteErrors: log.endpointWriteFails, Services: len(log.services),
		Overruns: w.overflows(), CPUSeconds: cpu1.cpu - cpu0.cpu, CPUWindows: cpuPer}
	var unseen int
	res.Latency, unseen = latencies(w, log.changes, cfg.Timeout)
	res.Unobserved = unseen
	res.ServiceLatency, res.ServicesUnobserved = latencies(w, log.services, cfg.Timeout)
	if res.Changes > 0 {
		res.CPUPerChange = res.CPUSeconds / float64(res.Changes)
	}
	delta := histogramDelta(before, p.histogram(histogram))
	res.Programming = histogramQuantiles(delta)
	if len(delta) > 0 {
		res.ProgrammingCount = delta[len(delta)-1].Count
	}
	// A refused write is the run's record, not the harness's failure: a
	// proxy far behind can load the machine until etcd times writes out
	// (upstream-nft at 200/s at 10,000). Its rows say so and are missed by
	// rule (whyNot); the smoke fails on any (checkChurnSmoke).
	for _, err := range log.errs {
		p.t.Logf("%s N=%d churn at %.0f/s: %v", p.name, n, rate, err)
	}
	return res
}

// latencies are the write-to-kernel times of addrs, those not seen (or
// seen after timeout) beyond it, and how many those are.
func latencies(w *kernelWatch, addrs []netip.Addr, timeout time.Duration) (Quantiles, int) {
	xs := make([]float64, 0, len(addrs))
	unseen := 0
	for _, a := range addrs {
		d, ok := w.seen(a)
		if !ok || d > timeout {
			unseen++
			xs = append(xs, math.Inf(1))
			continue
		}
		xs = append(xs, d.Seconds())
	}
	return sampleQuantiles(xs), unseen
}

// churnPhases runs proxy x's churn phases at n, one per rate, and logs
// each.
func churnPhases(t *testing.T, c *cluster, cfg config, n int, x *participant, res *Results, after func()) {
	var extra []string
	if cfg.Churn.ProfileDir != "" {
		extra = append(extra, "--profiling")
	}
	x.p.restartWithMinSync(n, cfg.Churn.MinSyncPeriod, cfg.limit(n)(x.name), extra...)
	for _, rate := range cfg.Churn.Rates {
		ch := x.p.churn(c, n, rate, cfg.Churn)
		ch.MinSyncPeriod = cfg.Churn.MinSyncPeriod.Seconds()
		res.Churns = append(res.Churns, stamp(res.Run.ID, 0, ch)...)
		t.Logf("%s N=%d churn %.0f/s for %.0f s: %d changes (%d unobserved, %d write errors), %d Services (%d unobserved), "+
			"lag %.0f ms, overruns %d; API write → kernel p50 %s p99 %s p99.9 %s; own histogram p50 %s p99 %s (%.0f observations, "+
			"interpolated); CPU %.2f s, %.2f ms per change",
			x.name, n, rate, ch.Seconds, ch.Changes, ch.Unobserved, ch.WriteErrors, ch.Services, ch.ServicesUnobserved,
			ch.Lag*1e3, ch.Overruns, fmtQ(ch.Latency.P50, ch.Timeout), fmtQ(ch.Latency.P99, ch.Timeout),
			fmtQ(ch.Latency.P999, ch.Timeout), fmtQ(ch.Programming.P50, 0), fmtQ(ch.Programming.P99, 0), ch.ProgrammingCount,
			ch.CPUSeconds, ch.CPUPerChange*1e3)
		after()
	}
}

// checkChurnSmoke checks the smoke's churn phases: every change written and
// observed, and figures that make sense (nothing is timed against an
// expectation).
func checkChurnSmoke(t *testing.T, cfg config, res *Results) {
	t.Helper()
	for _, n := range cfg.Churn.Ns {
		for _, p := range cfg.Proxies {
			if !cfg.Churn.churns(p, n) {
				continue
			}
			for _, rate := range cfg.Churn.Rates {
				c := res.churn(p, n, rate)
				if c == nil {
					t.Errorf("%s: no churn phase at N=%d, %.0f/s", p, n, rate)
					continue
				}
				want := int(math.Floor(rate * cfg.Churn.Duration.Seconds()))
				q := c.Latency
				switch {
				case c.Changes != want || c.WriteErrors != 0:
					t.Errorf("%s churn: %d changes acknowledged, %d refused; want %d and none", p, c.Changes, c.WriteErrors, want)
				case c.Unobserved != 0 || c.ServicesUnobserved != 0 || c.Overruns != 0:
					t.Errorf("%s churn: %d changes and %d of %d Services never seen in the kernel (%d overruns)", p, c.Unobserved,
						c.ServicesUnobserved, c.Services, c.Overruns)
				case c.Services < int(cfg.Churn.Duration.Seconds())-1:
					t.Errorf("%s churn: %d Services created in %v", p, c.Services, cfg.Churn.Duration)
				case !(q.P50 > 0 && q.P50 <= q.P99 && q.P99 <= q.P999 && q.P999 <= q.Max && q.Max < c.Timeout):
					t.Errorf("%s churn: latency quantiles out of order or range: %+v", p, q)
				case !(c.CPUPerChange > 0 && c.CPUPerChange < 1):
					t.Errorf("%s churn: CPU per change %v s", p, c.CPUPerChange)
				case c.ProgrammingCount <= 0:
					t.Errorf("%s churn: its kubeproxy_network_programming_duration_seconds did not grow", p)
				}
			}
		}
	}
}
