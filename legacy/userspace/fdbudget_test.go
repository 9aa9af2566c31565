package userspace

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpproxy/kp/proxy"
)

// fakeRedirector records what the backend writes (IPv4 only).
type fakeRedirector struct {
	mu      sync.Mutex
	written Rules
	writes  int
}

func (f *fakeRedirector) String() string           { return "fake" }
func (f *fakeRedirector) families() []proxy.Family { return []proxy.Family{proxy.IPv4} }
func (f *fakeRedirector) probe(context.Context) error {
	return nil
}

func (f *fakeRedirector) write(_ context.Context, _ proxy.Family, r Rules) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.written, f.writes = r, f.writes+1
	return nil
}

func (f *fakeRedirector) stamp(proxy.Family) (stamp, error) { return stamp{}, nil }
func (f *fakeRedirector) drifted(context.Context, proxy.Family, Rules) ([]string, error) {
	return nil, nil
}

// loopbackOps opens listeners on 127.0.0.1 (a UDP listener as two
// sockets, as listenUDP does on a dual-stack node).
func loopbackOps() netOps {
	ops := hostOps()
	ops.listenTCP = func() (*net.TCPListener, error) {
		return net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	}
	ops.listenUDP = func() ([]*net.UDPConn, error) {
		var out []*net.UDPConn
		for range 2 {
			c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				for _, c := range out {
					c.Close()
				}
				return nil, err
			}
			out = append(out, c)
		}
		return out, nil
	}
	// The tests dial the listeners themselves, which only a redirect does
	// in production: in a namespace where conntrack tracks, that is refused.
	ops.redirected = func(*net.TCPConn) error { return nil }
	return ops
}

// budgetWorld is a backend with an injected RLIMIT_NOFILE, a fake
// redirector and loopback listeners, and the State it syncs.
type budgetWorld struct {
	t     *testing.T
	b     *Backend
	red   *fakeRedirector
	log   *syncBuffer
	limit uint64
	st    *proxy.State
	gen   uint64
}

func newBudgetWorld(t *testing.T) *budgetWorld {
	w := &budgetWorld{t: t, red: &fakeRedirector{}, log: &syncBuffer{}, st: &proxy.State{
		Services:  map[proxy.ServicePortName]*proxy.ServicePort{},
		Endpoints: map[proxy.ServicePortName][]proxy.Endpoint{},
	}}
	b, err := New(proxy.Config{}, slog.New(slog.NewTextHandler(w.log, nil)), WithNetOps(loopbackOps()))
	if err != nil {
		t.Fatal(err)
	}
	b.red = w.red
	b.noFile = func() rlimitInfo { return rlimitInfo{cur: w.limit, max: w.limit} }
	w.b = b
	t.Cleanup(func() { b.Shutdown(context.Background()) })
	return w
}

// add adds service ports prefix-000 … with a ClusterIP each and one ready
// endpoint.
func (w *budgetWorld) add(prefix string, n int, proto v1.Protocol) {
	for i := range n {
		name := proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "demo", Name: fmt.Sprintf("%s-%03d", prefix, i)},
			Protocol: proto}
		vip := netip.AddrFrom4([4]byte{10, 96, byte(len(w.st.Services) / 250), byte(len(w.st.Services)%250 + 1)})
		w.st.Services[name] = &proxy.ServicePort{Name: name, Type: v1.ServiceTypeClusterIP, Protocol: proto, Port: 80,
			ClusterIPs: []netip.Addr{vip}}
		w.st.Endpoints[name] = []proxy.Endpoint{{IP: netip.MustParseAddr("10.244.0.5"), Port: 8080, Ready: true, Serving: true}}
		w.changed(name)
	}
}

// remove deletes the service ports prefix-000 … prefix-(n-1) of protocol.
func (w *budgetWorld) remove(prefix string, n int, proto v1.Protocol) {
	for i := range n {
		name := proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "demo", Name: fmt.Sprintf("%s-%03d", prefix, i)},
			Protocol: proto}
		delete(w.st.Services, name)
		delete(w.st.Endpoints, name)
		w.changed(name)
	}
}

func (w *budgetWorld) changed(name proxy.ServicePortName) {
	if w.st.Changed == nil {
		w.st.Changed = map[proxy.ServicePortName]struct{}{}
	}
	w.st.Changed[name] = struct{}{}
}

func (w *budgetWorld) sync() {
	w.t.Helper()
	w.gen++
	st := *w.st
	st.Generation = w.gen
	w.st.Changed = nil
	if err := w.b.Sync(context.Background(), &st); err != nil {
		w.t.Fatalf("sync %d: %v (service ports over the budget must not fail the sync)", w.gen, err)
	}
}

// budgetStep changes the State and the limit, syncs, and says which
// service ports must be refused (by name; the others are programmed).
type budgetStep struct {
	do      func(w *budgetWorld)
	limit   uint64
	refused []string
}

// names lists prefix-from … prefix-(to-1).
func names(prefix string, from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("demo/%s-%03d", prefix, i))
	}
	return out
}

// With RLIMIT_NOFILE 400 the listeners may hold 400 - 256 - 100 = 44
// sockets (a TCP listener one, a UDP listener two).
func TestServicePortsOverTheDescriptorBudgetAreRefusedAndTheRestProgrammed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []budgetStep
	}{
		{"50 TCP service ports: the first 44 by name get listeners, 6 are refused", []budgetStep{
			{func(w *budgetWorld) { w.add("web", 50, v1.ProtocolTCP) }, 400, names("web", 44, 50)},
		}},
		{"UDP listeners hold two sockets: 22 of 30", []budgetStep{
			{func(w *budgetWorld) { w.add("dns", 30, v1.ProtocolUDP) }, 400, names("dns", 22, 30)},
		}},
		{"listeners that work keep their descriptors: new service ports sorting first are refused", []budgetStep{
			{func(w *budgetWorld) { w.add("b", 40, v1.ProtocolTCP) }, 400, nil},
			{func(w *budgetWorld) { w.add("a", 10, v1.ProtocolTCP) }, 400, names("a", 4, 10)},
			{func(w *budgetWorld) {}, 400, names("a", 4, 10)}, // a sync with nothing changed: the same
		}},
		{"deleting Services makes room: the refused ones are programmed at the next sync", []budgetStep{
			{func(w *budgetWorld) { w.add("web", 50, v1.ProtocolTCP) }, 400, names("web", 44, 50)},
			{func(w *budgetWorld) { w.remove("web", 10, v1.ProtocolTCP) }, 400, nil},
		}},
		{"a raised limit: the refused ones are programmed at the next sync", []budgetStep{
			{func(w *budgetWorld) { w.add("web", 50, v1.ProtocolTCP) }, 400, names("web", 44, 50)},
			{func(w *budgetWorld) {}, 1000, nil},
		}},
		{"a limit below the reserve: every service port refused, the rules still written", []budgetStep{
			{func(w *budgetWorld) { w.add("web", 3, v1.ProtocolTCP) }, 200, names("web", 0, 3)},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newBudgetWorld(t)
			for i, step := range tc.steps {
				step.do(w)
				w.limit = step.limit
				writes := w.red.writes
				w.sync()
				checkBudgetStep(t, w, i, step, writes)
			}
		})
	}
}

func checkBudgetStep(t *testing.T, w *budgetWorld, i int, step budgetStep, writesBefore int) {
	t.Helper()
	refused := map[string]bool{}
	for _, n := range step.refused {
		refused[n] = true
	}
	budget, _ := listenerBudget(step.limit)
	// The Backend: listeners for the others, within the budget.
	w.b.mu.Lock()
	var sockets int
	for key, p := range w.b.proxies {
		sockets += p.sockets()
		if refused[key.name.String()] {
			t.Errorf("step %d: refused %s has a listener", i, key.name)
		}
	}
	w.b.mu.Unlock()
	if sockets > budget {
		t.Errorf("step %d: the listeners hold %d sockets, over the budget of %d", i, sockets, budget)
	}
	// The rules: written, a redirect for each programmed service port, a
	// reject for each refused one.
	w.red.mu.Lock()
	rules, writes := w.red.written, w.red.writes
	w.red.mu.Unlock()
	redirected, rejected := map[string]bool{}, map[string]bool{}
	for _, r := range rules.Redirects {
		redirected[r.Comment] = r.Verdict == VerdictRedirect && r.ToPort != 0
	}
	for _, r := range rules.Rejects {
		if r.Protocol != "" {
			rejected[r.Comment] = true
		}
	}
	if i == 0 && writes == writesBefore {
		t.Errorf("step %d: no redirect rules written", i)
	}
	for name := range w.st.Services {
		n := name.String()
		if refused[n] && (!rejected[n] || redirected[n]) {
			t.Errorf("step %d: refused %s: rejected %v, redirected %v; want rejected", i, n, rejected[n], redirected[n])
		}
		if !refused[n] && !redirected[n] {
			t.Errorf("step %d: %s is not redirected to a listener", i, n)
		}
	}
	// The report: Refused names them, the limit and what to do; the
	// metric counts them; the log says so once.
	err := w.b.Refused()
	if len(step.refused) == 0 {
		if err != nil {
			t.Errorf("step %d: Refused() = %v, want none", i, err)
		}
	} else {
		var re *RefusedError
		if !errors.As(err, &re) {
			t.Fatalf("step %d: Refused() = %v, want a *RefusedError", i, err)
		}
		var got []string
		for _, n := range re.ServicePorts {
			got = append(got, n.String())
		}
		if !slices.Equal(got, step.refused) {
			t.Errorf("step %d: refused %v, want %v", i, got, step.refused)
		}
		msg := err.Error()
		for _, want := range []string{step.refused[0], fmt.Sprintf("RLIMIT_NOFILE is %d", step.limit),
			fmt.Sprintf("may hold %d sockets", budget), "ulimit -n", "LimitNOFILE"} {
			if !strings.Contains(msg, want) {
				t.Errorf("step %d: the error does not say %q:\n%s", i, want, msg)
			}
		}
		if !strings.Contains(w.log.String(), "service ports refused") || !strings.Contains(w.log.String(), step.refused[0]) {
			t.Errorf("step %d: no log line names the refused service ports:\n%s", i, w.log.String())
		}
	}
	if n := gaugeValue(t, w.b.stats.refusedPorts); n != float64(len(step.refused)) {
		t.Errorf("step %d: kp_userspace_refused_service_ports = %v, want %d", i, n, len(step.refused))
	}
}

// gaugeValue reads a Prometheus gauge.
func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

// The listeners leave kp's reserve alone, and so do connections: past
// the limit less the reserve a new one is refused.
func TestFDRoomKeepsTheReserveFromConnections(t *testing.T) {
	b, err := New(proxy.Config{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	b.setLimits(rlimitInfo{cur: 1000, max: 1000})
	for _, tc := range []struct {
		name             string
		listeners, conns int
		need             int
		want             bool
	}{
		{"plenty of room", 100, 100, 2, true},
		{"a TCP pair fits exactly", 500, 242, 2, true},
		{"one over the reserve", 500, 243, 2, false},
		{"a UDP session fits", 500, 243, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b.listenerSockets.Store(int64(tc.listeners))
			b.conns = newConnSet()
			for range tc.conns {
				c1, c2 := net.Pipe()
				defer c2.Close()
				b.conns.add(c1)
			}
			if got := b.fdRoom(tc.need); got != tc.want {
				t.Errorf("fdRoom(%d) with %d listener and %d connection sockets under 1000: %v, want %v",
					tc.need, tc.listeners, tc.conns, got, tc.want)
			}
		})
	}
}

// A connection that would eat into kp's reserve is reset at once and
// counted; with room again, connections are proxied.
func TestTCPConnectionIntoTheReserveIsResetAndCounted(t *testing.T) {
	b, addr := loopbackTCPProxy(t, proxy.Config{}, tcpEcho(t))
	b.setLimits(rlimitInfo{cur: 1000, max: 1000})
	b.listenerSockets.Store(1000 - fdReserve - 1) // room for one socket, not a pair
	c, err := net.Dial("tcp4", addr)
	if err == nil {
		err = echoOnce(c, bufio.NewReader(c), "short")
		c.Close()
	}
	if err == nil {
		t.Errorf("a connection with no room for its pair was proxied")
	}
	if n := counterValue(t, b.stats.refused.WithLabelValues("TCP")); n != 1 {
		t.Errorf("kp_userspace_refused_connections_total = %v, want 1", n)
	}
	b.listenerSockets.Store(1000 - fdReserve - 2)
	c, err = net.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := echoOnce(c, bufio.NewReader(c), "room"); err != nil {
		t.Errorf("with room for the pair: %v", err)
	}
}
