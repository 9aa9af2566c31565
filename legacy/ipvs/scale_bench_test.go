package ipvs

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/moby/ipvs"
	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/test/netns"
)

var benchServices = flag.Int("bench.services", 1000, "Services (× 10 endpoints) of BenchmarkKernelFullSync")

// BenchmarkKernelFullSync is one cold full sync of N ClusterIP Services × 10
// endpoints into a fresh namespace, the work of kp-ipvs's cold start without
// the API server. It needs IPVS: run it in the VM, e.g.
//
//	vm.RunPackage(t, opts, "./legacy/ipvs", "^$", "-test.bench", "BenchmarkKernelFullSync", "-test.benchtime", "1x")
//
// Besides ns/op it reports the wall time spent in each seam per sync:
// ipvs-s/op (IPVS netlink), links-s/op (kp-ipvs0 and its addresses),
// ipset-s/op (ipset save and restore) and iptables-s/op (the rules); the
// rest is kp's own rendering and diffing.
func BenchmarkKernelFullSync(b *testing.B) {
	if testing.Short() {
		b.Skip("short")
	}
	st := benchState(*benchServices)
	var h timedHandle
	var l timedLinks
	var s timedIPSet
	var total time.Duration
	for b.Loop() {
		b.StopTimer()
		node := netns.NewNamespace(b, "ipvsbench")
		be, err := New(kernelConfig("rr"), nil, WithHandle(func(in Handle) Handle { h.Handle = in; return &h }))
		if err != nil {
			b.Fatal(err)
		}
		l.Links, be.links = be.links, &l
		s.IPSet, be.ipset = be.ipset, &s
		be.drainEvery = 0
		b.StartTimer()
		start := time.Now()
		err = netns.InNamespace(node, func() error { return be.Sync(context.Background(), st) })
		total += time.Since(start)
		b.StopTimer()
		_ = be.Shutdown(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(h.d.Seconds()/n, "ipvs-s/op")
	b.ReportMetric(l.d.Seconds()/n, "links-s/op")
	b.ReportMetric(s.d.Seconds()/n, "ipset-s/op")
	b.ReportMetric((total-h.d-l.d-s.d).Seconds()/n, "rest-s/op")
}

// benchState is n ClusterIP Services (10.96.0.0/16 on), each TCP 80 with 10
// endpoints of its own (10.2.0.0/16 on) and on no node, like make bench's
// workload (its EndpointSlices name no node).
func benchState(n int) *proxy.State {
	k := newKState()
	for i := range n {
		name := spn(fmt.Sprintf("svc-%d", i))
		ip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		k.st.Services[name] = &proxy.ServicePort{Name: name, Type: v1.ServiceTypeClusterIP,
			ClusterIPs: []netip.Addr{ip}, Port: 80, Protocol: v1.ProtocolTCP}
		var eps []proxy.Endpoint
		for j := range 10 {
			e := i*10 + j
			ip := netip.AddrFrom4([4]byte{10, 2 + byte(e>>16), byte(e >> 8), byte(e)})
			eps = append(eps, proxy.Endpoint{IP: ip, Port: 8080, Ready: true, Serving: true}.At("", ""))
		}
		k.st.Endpoints[name] = eps
		k.st.Changed[name] = struct{}{}
	}
	return k.next()
}

type timedHandle struct {
	Handle
	d time.Duration
}

func (t *timedHandle) time(start time.Time) { t.d += time.Since(start) }

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

type timedLinks struct {
	Links
	d time.Duration
}

func (t *timedLinks) Ensure() error {
	defer func(start time.Time) { t.d += time.Since(start) }(time.Now())
	return t.Links.Ensure()
}
func (t *timedLinks) Addrs() ([]netip.Addr, error) {
	defer func(start time.Time) { t.d += time.Since(start) }(time.Now())
	return t.Links.Addrs()
}
func (t *timedLinks) AddAddr(a netip.Addr) error {
	defer func(start time.Time) { t.d += time.Since(start) }(time.Now())
	return t.Links.AddAddr(a)
}

type timedIPSet struct {
	IPSet
	d time.Duration
}

func (t *timedIPSet) Restore(ctx context.Context, data []byte) error {
	defer func(start time.Time) { t.d += time.Since(start) }(time.Now())
	return t.IPSet.Restore(ctx, data)
}
func (t *timedIPSet) List(ctx context.Context) (map[string][]string, error) {
	defer func(start time.Time) { t.d += time.Since(start) }(time.Now())
	return t.IPSet.List(ctx)
}
