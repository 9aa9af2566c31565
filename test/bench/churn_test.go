package bench

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpproxy/kp/test/netns"
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

// churnServiceLife is how long a Service the churn creates lives: a proxy
// that syncs every few seconds (upstream-nft at 2,000 Services, under
// churn) never programs a Service deleted a second after its creation, and
// rightly; one that has not programmed it in 10 s is that far behind.
const churnServiceLife = 10 * time.Second

// churnInFlight bounds the writes in flight: past it a tick waits (and
// the wait shows as Churn.Lag), so a stuck API server cannot pile up
// goroutines without end.
const churnInFlight = 64

// churnBase is where churned endpoints live: 11.0.0.0/8, outside every
// range of the run (worlds 10/8, Services 100.64/12, fake endpoints
// 172.16/12, incremental changes 198.18/15), so each address names one
// change of the whole run; 11.255.255.255 is the watch's probe.
var churnBase = netip.MustParseAddr("11.0.0.0")

// churnProbe is an address only the watch's probe transaction writes.
var churnProbe = netip.MustParseAddr("11.255.255.255")

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

// churnTarget is the Service the k-th churn change edits: a stride prime
// to n walks every Service before it comes back to one (so two writes to
// one slice are n/rate seconds apart), skipping the samples and Service 0.
func churnTarget(k, n int) int {
	s := samples(n)
	i := (k*7919 + 7) % n
	for slices.Contains(s, i) {
		i = (i + 1) % n
	}
	return i
}

// nextChurnAddr draws the next address of churnBase.
func (c *cluster) nextChurnAddr() netip.Addr {
	k := c.churnAddrs.Add(1)
	if k >= 1<<24-1 {
		c.t.Fatalf("churn: out of addresses in %s/8", churnBase)
	}
	b := churnBase.As4()
	return netip.AddrFrom4([4]byte{b[0], byte(k >> 16), byte(k >> 8), byte(k)})
}

// rollOne replaces the next endpoint of Service i in turn with addr, as a
// rolling update replaces pods one by one, and returns the slice's new
// addresses.
func (c *cluster) rollOne(i int, addr netip.Addr) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	cur := c.current(i)
	j := c.rolled[i] % endpointsPer
	c.rolled[i]++
	cur[j] = addr.String()
	c.endpoints[i] = cur
	return slices.Clone(cur)
}

// current is Service i's endpoints as the run last wrote them (c.mu held).
func (c *cluster) current(i int) []string {
	if c.endpoints == nil {
		c.endpoints, c.rolled = map[int][]string{}, map[int]int{}
	}
	if cur, ok := c.endpoints[i]; ok {
		return cur
	}
	cur := make([]string, endpointsPer)
	for j := range cur {
		cur[j] = fakeEndpoint(i, j)
	}
	return cur
}

// writeSlice replaces Service i's EndpointSlice with addrs in one write,
// without reading it first (EndpointSlices take unconditional updates).
func (c *cluster) writeSlice(ctx context.Context, i int, addrs []string) error {
	if _, err := c.api.DiscoveryV1().EndpointSlices(namespace).Update(ctx, slice(i, addrs), metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update EndpointSlice %s/%s: %w", namespace, serviceName(i), err)
	}
	return nil
}

// churnService is the name of the k-th Service the churn phases create.
func churnService(k int64) string { return fmt.Sprintf("churn-%07d", k) }

// createService creates a Service named name and its EndpointSlice with
// endpoints addrs.
func (c *cluster) createService(ctx context.Context, name string, addrs []string) error {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec:       v1.ServiceSpec{Ports: []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: servicePort}}},
	}
	if _, err := c.api.CoreV1().Services(namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create Service %s/%s: %w", namespace, name, err)
	}
	sl := slice(0, addrs)
	sl.Name, sl.Labels = name, map[string]string{discovery.LabelServiceName: name}
	if _, err := c.api.DiscoveryV1().EndpointSlices(namespace).Create(ctx, sl, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create EndpointSlice %s/%s: %w", namespace, name, err)
	}
	return nil
}

// deleteService deletes Service name and its EndpointSlice.
func (c *cluster) deleteService(ctx context.Context, name string) error {
	if err := c.api.CoreV1().Services(namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete Service %s/%s: %w", namespace, name, err)
	}
	if err := c.api.DiscoveryV1().EndpointSlices(namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete EndpointSlice %s/%s: %w", namespace, name, err)
	}
	return nil
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
// second and one Service created and one deleted a second, for
// cfg.Duration, each change timed to the kernel by a kernelWatch in the
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
	go func() { // one Service created a second, and one deleted once they have lived churnServiceLife
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
			log.add(&log.services, first, c.createService(ctx, name, addrs))
			if live = append(live, name); len(live) > int(churnServiceLife/time.Second) {
				log.add(nil, netip.Addr{}, c.deleteService(ctx, live[0]))
				live = live[1:]
			}
		})
	}()
	lag = openLoop(rate, cfg.Duration, churnInFlight, func(k int) {
		i, addr := churnTarget(k, n), c.nextChurnAddr()
		addrs := c.rollOne(i, addr)
		w.expect(addr, time.Now())
		log.add(&log.changes, addr, c.writeSlice(ctx, i, addrs))
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
	for _, err := range log.errs {
		p.t.Errorf("%s N=%d churn at %.0f/s: %v", p.name, n, rate, err)
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

// cpuWindows samples the CPU time of process pid every window; the
// function it returns stops the sampling and gives each window's CPU
// seconds per change acknowledged in it (windows without a change left
// out).
func (p *proxyRun) cpuWindows(pid int, window time.Duration, acked *atomic.Int64) func() []float64 {
	stop, done := make(chan struct{}), make(chan []float64)
	go func() {
		var out []float64
		last, lastN := readProcCPU(pid), acked.Load()
		tick := time.NewTicker(max(window, 100*time.Millisecond))
		defer tick.Stop()
		for {
			select {
			case <-stop:
				done <- out
				return
			case <-tick.C:
				cpu, k := readProcCPU(pid), acked.Load()
				if k > lastN && cpu >= last {
					out = append(out, (cpu-last)/float64(k-lastN))
				}
				last, lastN = cpu, k
			}
		}
	}()
	return func() []float64 { close(stop); return <-done }
}

func readProcCPU(pid int) float64 {
	st, _ := readProc(pid)
	return st.cpu
}

// probe writes a transaction naming churnProbe in namespace ns and waits
// for the watch to see it: the watch works there before the phase begins.
func (w *kernelWatch) probe(ns string) error {
	w.expect(churnProbe, time.Now())
	script := fmt.Sprintf("add table ip kp-bench-probe; add chain ip kp-bench-probe c; "+
		"add rule ip kp-bench-probe c ip daddr %s accept; delete table ip kp-bench-probe", churnProbe)
	if out, err := netns.Exec(ns, "nft", script); err != nil {
		return fmt.Errorf("probe transaction: %v: %s", err, out)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, ok := w.seen(churnProbe); ok {
			return nil
		}
	}
	return fmt.Errorf("the kernel-event watch saw no event of its probe transaction in 10 s")
}

// histogram reads the buckets of the proxy's histogram name (unlabelled or
// IPv4), nil when it has none.
func (p *proxyRun) histogram(name string) []Bucket {
	code, body, err := netns.HTTPGet(p.w.Node(), "http://"+metricsAddr+"/metrics", 10*time.Second)
	if err != nil || code != 200 {
		p.t.Logf("%s: read its metrics: HTTP %d %v", p.name, code, err)
		return nil
	}
	return parseHistogram(body, name)
}

// parseHistogram picks histogram name's buckets out of a metrics page
// (the IPv4 series where there is a family label).
func parseHistogram(body, name string) []Bucket {
	var out []Bucket
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, name+"_bucket{") || strings.Contains(line, `"IPv6"`) {
			continue
		}
		_, rest, ok := strings.Cut(line, `le="`)
		if !ok {
			continue
		}
		le, rest, ok := strings.Cut(rest, `"`)
		sp := strings.LastIndexByte(rest, ' ')
		if !ok || sp < 0 {
			continue
		}
		bound, err1 := parseLE(le)
		var count float64
		_, err2 := fmt.Sscan(rest[sp+1:], &count)
		if err1 == nil && err2 == nil {
			out = append(out, Bucket{bound, count})
		}
	}
	return out
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

// restartWithMinSync restarts the proxy with its --min-sync-period (or
// upstream's name for it) set to d and the flags extra, over the rules it left, and waits
// for its first sync to hold every one of the n Services; nothing when it
// runs with d already.
func (p *proxyRun) restartWithMinSync(n int, d, timeout time.Duration, extra ...string) {
	p.t.Helper()
	args := withMinSync(p.args, d, extra...)
	if slices.Equal(args, p.args) {
		return
	}
	if err := p.proc.Stop(); err != nil {
		p.t.Logf("%s exited: %v", p.name, err)
	}
	p.args = args
	start := time.Now()
	p.proc = netns.StartIn(p.t, p.w.Node(), p.bin, p.args...)
	for deadline := start.Add(timeout); ; time.Sleep(50 * time.Millisecond) {
		if !p.proc.Running() {
			p.t.Fatalf("%s exited after its restart with --min-sync-period %v: %v\n%s", p.name, d, p.proc.ExitErr(), tail(p.proc.Log()))
		}
		if p.lastSync() > float64(start.UnixNano())/1e9 {
			if count, err := p.count(); err == nil && count >= n {
				return
			}
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s: not synced %v after its restart with --min-sync-period %v", p.name, timeout, d)
		}
	}
}

// profile writes the proxy's CPU profile of the middle half of a phase of
// length d into file (for NOTES.md's explanations; logged, not checked).
func (p *proxyRun) profile(file string, d time.Duration) {
	time.Sleep(d / 4)
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", metricsAddr, max(int(d.Seconds()/2), 1))
	code, body, err := netns.HTTPGet(p.w.Node(), url, d)
	if err == nil && code != 200 {
		err = fmt.Errorf("HTTP %d", code)
	}
	if err == nil {
		err = os.WriteFile(file, []byte(body), 0o644)
	}
	p.t.Logf("%s: CPU profile %s: %v", p.name, file, err)
}

// withMinSync is a proxy's args with every *min-sync-period flag (kp's
// --min-sync-period, upstream's --iptables-min-sync-period) set to d and
// the flags extra added where missing.
func withMinSync(args []string, d time.Duration, extra ...string) []string {
	out := slices.Clone(args)
	for _, a := range extra {
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	for i := 0; i+1 < len(out); i++ {
		if strings.HasSuffix(out[i], "min-sync-period") {
			out[i+1] = d.String()
		}
	}
	return out
}
