package ipvs

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/moby/ipvs"
	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
	"github.com/kpproxy/kp/test/netns"
)

var benchServices = flag.Int("bench.services", 1000, "Services (× 10 endpoints) of BenchmarkKernelFullSync and BenchmarkKernelPartialSync")

// BenchmarkKernelFullSync is one cold full sync of N ClusterIP Services × 10
// endpoints into a fresh namespace, the work of kp-ipvs's cold start without
// the API server. It needs IPVS: run it in the VM, e.g.
//
//	vm.RunPackage(t, opts, "./legacy/ipvs", "^$", "-test.bench", "BenchmarkKernelFullSync", "-test.benchtime", "1x")
//
// Besides ns/op it reports the wall time spent in each seam per sync
// (benchTimers): ipvs-s/op (IPVS netlink), links-s/op (kp-ipvs0 and its
// addresses), ipset-s/op (ipset save and restore), localaddrs-s/op (the
// node's addresses, for the NodePorts) and rest-s/op (the iptables rules,
// kp's own rendering and diffing).
func BenchmarkKernelFullSync(b *testing.B) {
	if testing.Short() {
		b.Skip("short")
	}
	st := benchState(*benchServices)
	var t benchTimers
	for b.Loop() {
		b.StopTimer()
		node := netns.NewNamespace(b, "ipvsbench")
		be := t.backend(b)
		b.StartTimer()
		err := t.sync(node, be, st)
		b.StopTimer()
		_ = be.Shutdown(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	t.report(b)
}

// BenchmarkKernelPartialSync is one endpoint change (one endpoint address
// of one Service replaced) after a full sync of N Services × 10: kp-ipvs's
// own sync per change, with the same seams reported as
// BenchmarkKernelFullSync. In the VM, like it.
func BenchmarkKernelPartialSync(b *testing.B) {
	if testing.Short() {
		b.Skip("short")
	}
	st := benchState(*benchServices)
	var t benchTimers
	node := netns.NewNamespace(b, "ipvsbench")
	be := t.backend(b)
	b.Cleanup(func() { _ = be.Shutdown(context.Background()) })
	if err := t.sync(node, be, st); err != nil {
		b.Fatal(err)
	}
	t = benchTimers{h: timedHandle{Handle: t.h.Handle}, l: timedLinks{Links: t.l.Links}, s: timedIPSet{IPSet: t.s.IPSet}}
	name := statetest.PortName("ns", "svc-0", "", v1.ProtocolTCP)
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		eps := slices.Clone(st.Endpoints[name])
		eps[0].IP = netip.AddrFrom4([4]byte{10, 250, byte(i >> 8), byte(i)})
		st.Endpoints[name] = eps
		st.Changed = map[proxy.ServicePortName]struct{}{name: {}}
		st.Generation++
		b.StartTimer()
		if err := t.sync(node, be, st); err != nil {
			b.Fatal(err)
		}
		if be.LastSyncFull() {
			b.Fatal("an endpoint change made a full sync")
		}
	}
	t.report(b)
}

// benchTimers time a backend's syncs per seam.
type benchTimers struct {
	h     timedHandle
	l     timedLinks
	s     timedIPSet
	addrs stopwatch
	total time.Duration
}

// backend is a kp-ipvs Backend whose seams t times (its IPVS socket opens
// at the first sync, in the namespace of that sync).
func (t *benchTimers) backend(b *testing.B) *Backend {
	be, err := New(kernelConfig("rr"), nil,
		WithHandle(func(in Handle) Handle { t.h.Handle = in; return &t.h }),
		WithLocalAddrs(func() ([]netip.Addr, error) {
			defer t.addrs.time(time.Now())
			return proxy.LocalAddrs()
		}))
	if err != nil {
		b.Fatal(err)
	}
	t.l.Links, be.links = be.links, &t.l
	t.s.IPSet, be.ipset = be.ipset, &t.s
	be.drainEvery = 0
	return be
}

// sync syncs st in namespace node and adds its wall time to the total.
func (t *benchTimers) sync(node string, be *Backend, st *proxy.State) error {
	start := time.Now()
	err := netns.InNamespace(node, func() error { return be.Sync(context.Background(), st) })
	t.total += time.Since(start)
	return err
}

func (t *benchTimers) report(b *testing.B) {
	n := float64(b.N)
	b.ReportMetric(t.h.d.Seconds()/n, "ipvs-s/op")
	b.ReportMetric(t.l.d.Seconds()/n, "links-s/op")
	b.ReportMetric(t.s.d.Seconds()/n, "ipset-s/op")
	b.ReportMetric(t.addrs.d.Seconds()/n, "localaddrs-s/op")
	b.ReportMetric((t.total-t.h.d-t.l.d-t.s.d-t.addrs.d).Seconds()/n, "rest-s/op")
}

// benchState is n ClusterIP Services (10.96.0.0/16 on), each TCP 80 with 10
// endpoints of its own (10.2.0.0/16 on) and on no node, like make bench's
// workload (its EndpointSlices name no node).
func benchState(n int) *proxy.State {
	k := newKState()
	for i := range n {
		name := statetest.PortName("ns", fmt.Sprintf("svc-%d", i), "", v1.ProtocolTCP)
		ip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		k.Services[name] = &proxy.ServicePort{Name: name, Type: v1.ServiceTypeClusterIP,
			ClusterIPs: []netip.Addr{ip}, Port: 80, Protocol: v1.ProtocolTCP}
		var eps []proxy.Endpoint
		for j := range 10 {
			e := i*10 + j
			ip := netip.AddrFrom4([4]byte{10, 2 + byte(e>>16), byte(e >> 8), byte(e)})
			eps = append(eps, proxy.Endpoint{IP: ip, Port: 8080, Ready: true, Serving: true}.At("", ""))
		}
		k.Endpoints[name] = eps
		k.Changed[name] = struct{}{}
	}
	return k.Next()
}

// stopwatch sums the wall time of the calls that add to it:
// defer w.time(time.Now()).
type stopwatch struct{ d time.Duration }

func (w *stopwatch) time(start time.Time) { w.d += time.Since(start) }

type timedHandle struct {
	Handle
	stopwatch
}

func (t *timedHandle) GetServices() ([]*ipvs.Service, error) {
	defer t.time(time.Now())
	return t.Handle.GetServices()
}
func (t *timedHandle) NewService(s *ipvs.Service) error {
	defer t.time(time.Now())
	return t.Handle.NewService(s)
}
func (t *timedHandle) GetDestinations(s *ipvs.Service) ([]*ipvs.Destination, error) {
	defer t.time(time.Now())
	return t.Handle.GetDestinations(s)
}
func (t *timedHandle) NewDestination(s *ipvs.Service, d *ipvs.Destination) error {
	defer t.time(time.Now())
	return t.Handle.NewDestination(s, d)
}
func (t *timedHandle) IsServicePresent(s *ipvs.Service) bool {
	defer t.time(time.Now())
	return t.Handle.IsServicePresent(s)
}
func (t *timedHandle) GetService(s *ipvs.Service) (*ipvs.Service, error) {
	defer t.time(time.Now())
	return t.Handle.GetService(s)
}
func (t *timedHandle) UpdateDestination(s *ipvs.Service, d *ipvs.Destination) error {
	defer t.time(time.Now())
	return t.Handle.UpdateDestination(s, d)
}
func (t *timedHandle) DelDestination(s *ipvs.Service, d *ipvs.Destination) error {
	defer t.time(time.Now())
	return t.Handle.DelDestination(s, d)
}

type timedLinks struct {
	Links
	stopwatch
}

func (t *timedLinks) Ensure() error {
	defer t.time(time.Now())
	return t.Links.Ensure()
}
func (t *timedLinks) Addrs() ([]netip.Addr, error) {
	defer t.time(time.Now())
	return t.Links.Addrs()
}
func (t *timedLinks) AddAddr(a netip.Addr) error {
	defer t.time(time.Now())
	return t.Links.AddAddr(a)
}

type timedIPSet struct {
	IPSet
	stopwatch
}

func (t *timedIPSet) Restore(ctx context.Context, data []byte) error {
	defer t.time(time.Now())
	return t.IPSet.Restore(ctx, data)
}
func (t *timedIPSet) List(ctx context.Context) (map[string][]string, error) {
	defer t.time(time.Now())
	return t.IPSet.List(ctx)
}

// BenchmarkKernelDriftCheck is one drift check (drift.go) after a full
// sync of N Services × 10: the virtual servers, the real servers of each
// and kp-ipvs0's addresses read and compared, every period while kp runs.
// In the VM, like BenchmarkKernelFullSync; test/bench/NOTES.md, "Drift
// repair", records the runs.
func BenchmarkKernelDriftCheck(b *testing.B) {
	if testing.Short() {
		b.Skip("short")
	}
	st := benchState(*benchServices)
	var t benchTimers
	node := netns.NewNamespace(b, "ipvsbench")
	be := t.backend(b)
	b.Cleanup(func() { _ = be.Shutdown(context.Background()) })
	if err := t.sync(node, be, st); err != nil {
		b.Fatal(err)
	}
	t = benchTimers{h: timedHandle{Handle: t.h.Handle}, l: timedLinks{Links: t.l.Links}, s: timedIPSet{IPSet: t.s.IPSet}}
	err := netns.InNamespace(node, func() error {
		for b.Loop() {
			start := time.Now()
			d, err := be.checkDrift(context.Background())
			t.total += time.Since(start)
			if d != nil || err != nil {
				return fmt.Errorf("drift %v, %v", d, err)
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	t.report(b)
}
