package ipvs

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moby/ipvs"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/test/netns"
)

// recording is a Handle that logs the virtual servers each call touches.
type recording struct {
	Handle
	mu      sync.Mutex
	touched []string
	failDst string // NewDestination to this address fails once
}

func (r *recording) note(s *ipvs.Service, what string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if k, ok := kernelKey(s); ok {
		r.touched = append(r.touched, what+" "+k.String())
	}
}

func (r *recording) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.touched
	r.touched = nil
	return out
}

func (r *recording) NewService(s *ipvs.Service) error {
	r.note(s, "new")
	return r.Handle.NewService(s)
}
func (r *recording) UpdateService(s *ipvs.Service) error {
	r.note(s, "update")
	return r.Handle.UpdateService(s)
}
func (r *recording) DelService(s *ipvs.Service) error {
	r.note(s, "del")
	return r.Handle.DelService(s)
}
func (r *recording) GetDestinations(s *ipvs.Service) ([]*ipvs.Destination, error) {
	r.note(s, "read")
	return r.Handle.GetDestinations(s)
}
func (r *recording) NewDestination(s *ipvs.Service, d *ipvs.Destination) error {
	r.note(s, "new-dest")
	r.mu.Lock()
	fail := r.failDst != "" && d.Address.String() == r.failDst
	if fail {
		r.failDst = ""
	}
	r.mu.Unlock()
	if fail {
		return syscall.ENOMEM
	}
	return r.Handle.NewDestination(s, d)
}
func (r *recording) UpdateDestination(s *ipvs.Service, d *ipvs.Destination) error {
	r.note(s, "update-dest")
	return r.Handle.UpdateDestination(s, d)
}

func newKernelBackend(t *testing.T, cfg proxy.Config, rec *recording, opts ...Option) *Backend {
	t.Helper()
	opts = append([]Option{WithHandle(func(h Handle) Handle { rec.Handle = h; return rec })}, opts...)
	b, err := New(cfg, nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Shutdown(context.Background()) })
	return b
}

func (w *kworld) sync(b *Backend, st *proxy.State) {
	w.t.Helper()
	w.in(func() error { return b.Sync(context.Background(), st) })
}

func TestKernelRoundRobinSpreadsExactlyEvenlyAndSyncsOnlyTheChange(t *testing.T) {
	inVM(t)
	w := newKWorld(t, 3)
	rec := &recording{}
	b := newKernelBackend(t, kernelConfig("rr"), rec)
	k := newKState()
	web := k.add("web", "10.96.0.10", 80, 30080, w.podIPs...)
	k.add("db", "10.96.0.11", 5432, 0, w.podIPs[0])
	w.in(func() error { return b.Probe(context.Background()) })
	w.sync(b, k.Next())

	for _, addr := range []string{"10.96.0.10:80", "10.1.0.1:30080"} {
		counts := map[string]int{}
		for i := 0; i < 30; i++ {
			name, err := w.askOnce(addr)
			if err != nil {
				t.Fatalf("connection %d to %s: %v", i, addr, err)
			}
			counts[name]++
		}
		if counts["pod-0"] != 10 || counts["pod-1"] != 10 || counts["pod-2"] != 10 {
			t.Errorf("rr over 3 endpoints, 30 connections to %s: %v, want 10 each", addr, counts)
		}
	}

	// An endpoint change touches web's servers only.
	rec.take()
	k.setEndpoints(web, w.podIPs[:2]...)
	w.sync(b, k.Next())
	if b.LastSyncFull() {
		t.Error("the endpoint change was a full sync")
	}
	for _, c := range rec.take() {
		if strings.Contains(c, "10.96.0.11") {
			t.Errorf("the endpoint change of web touched db: %s", c)
		}
	}
	for i := 0; i < 6; i++ {
		if name, err := w.askOnce("10.96.0.10:80"); err != nil || name == "pod-2" {
			t.Errorf("after removing pod-2: %q, %v", name, err)
		}
	}

	// IPVS sums its per-CPU statistics every 2 s (its rate estimator):
	// the counts lag the connections by that much.
	var c proxy.EndpointCounter
	for deadline := time.Now().Add(8 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		var counters map[proxy.EndpointRef]proxy.EndpointCounter
		w.in(func() (err error) { counters, err = b.EndpointCounters(&k.State); return err })
		c = counters[proxy.EndpointRef{ServicePort: web, Endpoint: netip.AddrPortFrom(w.podIPs[0], 8080)}]
		if c.Packets >= 20 && c.Active != nil || time.Now().After(deadline) {
			break
		}
	}
	if c.Packets < 20 || c.Active == nil || c.Bytes == 0 {
		t.Errorf("pod-0's counters of web = %+v, want at least 20 connections (ClusterIP and NodePort), bytes and an active count", c)
	}
}

func TestKernelSourceHashingKeepsAClientOnOneEndpoint(t *testing.T) {
	inVM(t)
	w := newKWorld(t, 3)
	b := newKernelBackend(t, kernelConfig("sh"), &recording{})
	k := newKState()
	k.add("web", "10.96.0.10", 80, 0, w.podIPs...)
	w.sync(b, k.Next())
	first := ""
	for i := 0; i < 20; i++ {
		name, err := w.askOnce("10.96.0.10:80")
		if err != nil {
			t.Fatal(err)
		}
		if first == "" {
			first = name
		}
		if name != first {
			t.Fatalf("sh: connection %d went to %s, the first to %s", i, name, first)
		}
	}
}

func TestKernelOpenConnectionToARemovedEndpointKeepsWorkingUntilItCloses(t *testing.T) {
	inVM(t)
	w := newKWorld(t, 2)
	rec := &recording{}
	b := newKernelBackend(t, kernelConfig("rr"), rec, WithDrain(2*time.Second, 100*time.Millisecond))
	k := newKState()
	web := k.add("web", "10.96.0.10", 80, 0, w.podIPs...)
	w.sync(b, k.Next())

	c, err := w.dial("10.96.0.10:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.c.Close()
	pod, err := c.ask()
	if err != nil {
		t.Fatal(err)
	}
	idx := map[string]int{"pod-0": 0, "pod-1": 1}[pod]
	other := w.podIPs[1-idx]
	k.setEndpoints(web, other)
	w.sync(b, k.Next())

	// Its own IPVS socket: the backend's drain loop uses the backend's,
	// and a netlink socket read by two goroutines mixes their answers.
	var h *ipvs.Handle
	w.in(func() (err error) { h, err = ipvs.New(""); return err })
	defer h.Close()
	dest := func() *ipvs.Destination {
		var found *ipvs.Destination
		w.in(func() error {
			ds, err := h.GetDestinations(keyService(vsKey{"TCP", netip.MustParseAddr("10.96.0.10"), 80}))
			for _, d := range ds {
				if destAddrPort(d).Addr() == w.podIPs[idx] {
					found = d
				}
			}
			return err
		})
		return found
	}
	if d := dest(); d == nil || d.Weight != 0 {
		t.Fatalf("the removed endpoint with an open connection: %+v, want it kept at weight 0", d)
	}
	for i := 0; i < 5; i++ {
		if got, err := c.ask(); err != nil || got != pod {
			t.Fatalf("the open connection after its endpoint was removed: %q, %v; want %s", got, err, pod)
		}
		if name, err := w.askOnce("10.96.0.10:80"); err != nil || name == pod {
			t.Errorf("a new connection went to the draining %s (%q, %v)", pod, name, err)
		}
		time.Sleep(700 * time.Millisecond) // past the drain bound: an active connection outlives it
	}
	c.c.Close()
	// IPVS keeps the closed connection as inactive (TIME_WAIT, 2 minutes);
	// past the drain bound, with no active connection, the drain loop
	// deletes the real server.
	deadline := time.Now().Add(20 * time.Second)
	for dest() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("the drained endpoint is still there 20 s after its last connection closed: %+v", dest())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestKernelNetlinkErrorNamesTheServiceAndTheNextSyncReconciles(t *testing.T) {
	inVM(t)
	w := newKWorld(t, 2)
	rec := &recording{}
	b := newKernelBackend(t, kernelConfig("rr"), rec)
	k := newKState()
	web := k.add("web", "10.96.0.10", 80, 0, w.podIPs[0])
	w.sync(b, k.Next())
	rec.failDst = w.podIPs[1].String()
	k.setEndpoints(web, w.podIPs...)
	var err error
	_ = netns.InNamespace(w.node, func() error { err = b.Sync(context.Background(), k.Next()); return nil })
	if err == nil || !strings.Contains(err.Error(), "service port ns/web") || !errors.Is(err, syscall.ENOMEM) {
		t.Fatalf("sync error = %v, want one naming service port ns/web", err)
	}
	w.sync(b, k.Next()) // nothing changed: a full sync, from the kernel
	if !b.LastSyncFull() {
		t.Error("the sync after a failure was not full")
	}
	seen := map[string]bool{}
	for i := 0; i < 4; i++ {
		name, err := w.askOnce("10.96.0.10:80")
		if err != nil {
			t.Fatal(err)
		}
		seen[name] = true
	}
	if !seen["pod-0"] || !seen["pod-1"] {
		t.Errorf("after the repair, connections reached %v, want both pods", seen)
	}
}

func TestKernelCleanupLeavesForeignIPVSIPSetsAndChains(t *testing.T) {
	inVM(t)
	w := newKWorld(t, 1)
	b := newKernelBackend(t, kernelConfig("rr"), &recording{})
	k := newKState()
	k.add("web", "10.96.0.10", 80, 30080, w.podIPs...)
	w.sync(b, k.Next())
	foreign := &ipvs.Service{Address: net.ParseIP("10.200.0.1"), Protocol: syscall.IPPROTO_TCP, Port: 80,
		AddressFamily: syscall.AF_INET, SchedName: "rr", Netmask: 0xffffffff}
	for _, cmd := range [][]string{
		{"ipset", "create", "FOREIGN", "hash:ip"},
		{"iptables-nft", "-t", "nat", "-N", "KUBE-SERVICES"},
		{"iptables-nft", "-t", "nat", "-A", "PREROUTING", "-j", "KUBE-SERVICES"},
		{"iptables-nft", "-t", "nat", "-N", "KP-SERVICES"}, // the iptables mode's
	} {
		if out, err := netns.Exec(w.node, cmd...); err != nil {
			t.Fatalf("%v: %v\n%s", cmd, err, out)
		}
	}
	w.in(func() error {
		h, err := ipvs.New("")
		if err != nil {
			return err
		}
		defer h.Close()
		return h.NewService(foreign)
	})

	w.in(func() error { return b.Cleanup(context.Background()) })

	out, _ := netns.Exec(w.node, "sh", "-c", "ipvsadm -Ln; ipset list -n; iptables-nft-save -t nat; iptables-nft-save -t filter; ip link")
	for _, gone := range []string{"10.96.0.10:80", "10.1.0.1:30080", "KP-CLUSTER-IP", "KP-IPVS-", "kp-ipvs0"} {
		if strings.Contains(out, gone) {
			t.Errorf("cleanup left %q:\n%s", gone, out)
		}
	}
	for _, kept := range []string{"10.200.0.1:80", "FOREIGN", "-A PREROUTING -j KUBE-SERVICES", ":KP-SERVICES"} {
		if !strings.Contains(out, kept) {
			t.Errorf("cleanup removed another program's %q:\n%s", kept, out)
		}
	}
}

// TestKernelDriftCheckReadsTheTableAndFindsADeletedVirtualServer: the
// drift check reads the kernel's table (/proc/net/ip_vs) as kp wrote it,
// persistence and IPv6 included, as no drift; ipvsadm -D of a virtual
// server is one, and the sync after it puts it back.
func TestKernelDriftCheckReadsTheTableAndFindsADeletedVirtualServer(t *testing.T) {
	inVM(t)
	w := newKWorld(t, 2)
	b := newKernelBackend(t, kernelConfig("rr"), &recording{})
	k := newKState()
	k.add("web", "10.96.0.10", 80, 30080, w.podIPs...)
	sticky := k.add("sticky", "10.96.0.11", 80, 0, w.podIPs[0])
	k.Services[sticky].AffinityTimeout = 3 * time.Hour
	w.in(func() error { return b.Probe(context.Background()) })
	st := k.Next()
	w.sync(b, st)
	check := func() string {
		t.Helper()
		var what string
		w.in(func() error {
			d, err := b.checkDrift(context.Background())
			if d != nil {
				what = d.What
			}
			return err
		})
		return what
	}
	if d := check(); d != "" {
		t.Fatalf("right after kp's sync: %s", d)
	}
	if out, err := netns.Exec(w.node, "ipvsadm", "-D", "-t", "10.96.0.10:80"); err != nil {
		t.Fatalf("ipvsadm -D: %v\n%s", err, out)
	}
	if d := check(); d != "IPVS: virtual server tcp/10.96.0.10:80: deleted" {
		t.Errorf("after ipvsadm -D: %q", d)
	}
	w.sync(b, st)
	if d := check(); d != "" {
		t.Errorf("after the repair: %s", d)
	}
	if _, err := w.askOnce("10.96.0.10:80"); err != nil {
		t.Errorf("after the repair: %v", err)
	}
}
