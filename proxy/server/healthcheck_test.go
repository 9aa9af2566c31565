package server

import (
	"bytes"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
)

// hcState is a State with one LoadBalancer Service ns/lb (two ports, both
// families) whose healthCheckNodePort is port, and the given endpoints on
// both of its ports.
func hcState(port int32, eps ...proxy.Endpoint) *proxy.State {
	st := &proxy.State{Services: map[proxy.ServicePortName]*proxy.ServicePort{}, Endpoints: map[proxy.ServicePortName][]proxy.Endpoint{},
		Node: proxy.Node{Name: "node-a", IPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}}}
	for _, p := range []string{"http", "https"} {
		name := statetest.PortName("ns", "lb", p, "TCP")
		st.Services[name] = &proxy.ServicePort{Name: name, Type: v1.ServiceTypeLoadBalancer, ExternalPolicyLocal: true,
			HealthCheckNodePort: port,
			ClusterIPs:          []netip.Addr{netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("fd00::1")}}
		st.Endpoints[name] = eps
	}
	return st
}

func nodeEp(ip, node string, ready bool) proxy.Endpoint {
	return proxy.Endpoint{IP: netip.MustParseAddr(ip), Port: 8080, Ready: ready, Serving: ready}.At(node, "")
}

func TestHealthChecksCountDistinctLocalReadyAddressesPerFamily(t *testing.T) {
	st := hcState(30000,
		nodeEp("10.0.0.1", "node-a", true),
		nodeEp("10.0.0.2", "node-a", true),
		nodeEp("10.0.0.3", "node-a", false), // not ready
		nodeEp("10.0.0.4", "node-b", true),  // another node
		nodeEp("fd00::a", "node-a", true),
		proxy.Endpoint{IP: netip.MustParseAddr("10.0.0.5"), Serving: true, Terminating: true}.At("node-a", ""),
	)
	ports, counts := healthChecks(st, proxy.NewPortSet(hasHealthCheck).Update(st))
	svc := types.NamespacedName{Namespace: "ns", Name: "lb"}
	v4, v6 := hcKey{svc, proxy.IPv4}, hcKey{svc, proxy.IPv6}
	if ports[v4] != 30000 || ports[v6] != 30000 || len(ports) != 2 {
		t.Errorf("ports = %v", ports)
	}
	// Two ports share the same addresses: counted once, as upstream.
	if counts[v4] != 2 || counts[v6] != 1 {
		t.Errorf("counts = %v, want IPv4 2 and IPv6 1", counts)
	}
}

func TestServiceHealthHandlerAnswersLikeUpstream(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name        string
		eps         []proxy.Endpoint
		synced      bool
		stale       bool
		wantCode    int
		wantBody    string
		wantWeight  string
		wantHealthy bool
	}{
		{
			name:     "local ready endpoints: 200 with their count",
			eps:      []proxy.Endpoint{nodeEp("10.0.0.1", "node-a", true), nodeEp("10.0.0.2", "node-a", true)},
			synced:   true,
			wantCode: http.StatusOK,
			wantBody: "{\n\t\"service\": {\n\t\t\"namespace\": \"ns\",\n\t\t\"name\": \"lb\"\n\t},\n\t\"localEndpoints\": 2,\n" +
				"\t\"serviceProxyHealthy\": true\n}",
			wantWeight: "2",
		},
		{
			name:     "no local endpoint: 503",
			eps:      []proxy.Endpoint{nodeEp("10.0.0.1", "node-b", true)},
			synced:   true,
			wantCode: http.StatusServiceUnavailable,
			wantBody: "{\n\t\"service\": {\n\t\t\"namespace\": \"ns\",\n\t\t\"name\": \"lb\"\n\t},\n\t\"localEndpoints\": 0,\n" +
				"\t\"serviceProxyHealthy\": true\n}",
			wantWeight: "0",
		},
		{
			name:     "unhealthy proxy: 503 even with local endpoints",
			eps:      []proxy.Endpoint{nodeEp("10.0.0.1", "node-a", true)},
			synced:   true,
			stale:    true,
			wantCode: http.StatusServiceUnavailable,
			wantBody: "{\n\t\"service\": {\n\t\t\"namespace\": \"ns\",\n\t\t\"name\": \"lb\"\n\t},\n\t\"localEndpoints\": 1,\n" +
				"\t\"serviceProxyHealthy\": false\n}",
			wantWeight: "1",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(start)
			health := NewHealth(time.Minute, clk)
			health.Updated(clk.Now())
			if tt.stale {
				health.QueuedUpdate(clk.Now())
				clk.Step(time.Minute)
			}
			s := NewServiceHealthServer(ServiceHealthOptions{Healthy: health.Healthy,
				Listen: func(string, string) (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }})
			defer s.Close()
			s.Sync(hcState(30000, tt.eps...))
			srv := httptest.NewServer(s.handler(hcKey{types.NamespacedName{Namespace: "ns", Name: "lb"}, proxy.IPv4}))
			defer srv.Close()
			resp, err := http.Get(srv.URL + "/")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body bytes.Buffer
			_, _ = body.ReadFrom(resp.Body)
			if resp.StatusCode != tt.wantCode || body.String() != tt.wantBody {
				t.Errorf("got %d %q, want %d %q", resp.StatusCode, body.String(), tt.wantCode, tt.wantBody)
			}
			for h, want := range map[string]string{"Content-Type": "application/json", "X-Content-Type-Options": "nosniff",
				"X-Load-Balancing-Endpoint-Weight": tt.wantWeight} {
				if got := resp.Header.Get(h); got != want {
					t.Errorf("header %s = %q, want %q", h, got, want)
				}
			}
		})
	}
}

func TestServiceHealthPortsOpenAndCloseWithServices(t *testing.T) {
	port := freePort(t)
	var logs bytes.Buffer
	s := NewServiceHealthServer(ServiceHealthOptions{Log: slog.New(slog.NewTextHandler(&logs, nil)), NodePortPrimary: true})
	defer s.Close()
	url := "http://" + netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port)).String() + "/"

	s.Sync(hcState(port, nodeEp("10.0.0.1", "node-a", true)))
	if code := httpCode(t, url); code != http.StatusOK {
		t.Fatalf("after the Service appeared: %d, want 200", code)
	}
	// The endpoint moves to another node: the same listener says 503.
	s.Sync(hcState(port, nodeEp("10.0.0.1", "node-b", true)))
	if code := httpCode(t, url); code != http.StatusServiceUnavailable {
		t.Fatalf("after the endpoint moved away: %d, want 503", code)
	}
	// The Service goes away: the port is closed.
	s.Sync(&proxy.State{Node: proxy.Node{Name: "node-a", IPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}}})
	if _, err := http.Get(url); err == nil {
		t.Fatal("health check port still open after its Service was deleted")
	}
	// After Close, a last sync of a shutting-down proxy opens nothing.
	s.Close()
	s.Sync(hcState(port, nodeEp("10.0.0.1", "node-a", true)))
	if _, err := http.Get(url); err == nil {
		t.Fatal("health check port opened by a Sync after Close")
	}
}

func TestServiceHealthPortInUseIsLoggedAndSkipped(t *testing.T) {
	busy, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	port := int32(busy.Addr().(*net.TCPAddr).Port)
	var logs bytes.Buffer
	s := NewServiceHealthServer(ServiceHealthOptions{Log: slog.New(slog.NewTextHandler(&logs, nil)), NodePortPrimary: true})
	defer s.Close()

	other := hcState(freePort(t), nodeEp("10.0.0.1", "node-a", true))
	st := hcState(port, nodeEp("10.0.0.1", "node-a", true))
	for name, sp := range other.Services {
		name.Name = "other"
		cp := *sp
		cp.Name = name
		st.Services[name] = &cp
		st.Endpoints[name] = other.Endpoints[statetest.PortName("ns", "lb", name.Port, "TCP")]
	}
	s.Sync(st)
	s.Sync(st) // retried, not logged again
	out := logs.String()
	if strings.Count(out, "cannot open health check port") != 1 || !strings.Contains(out, "service=ns/lb") ||
		!strings.Contains(out, "address already in use") {
		t.Errorf("want one log line naming ns/lb and the error, got:\n%s", out)
	}
	if n, ok := s.LocalEndpoints(types.NamespacedName{Namespace: "ns", Name: "other"}, proxy.IPv4); !ok || n != 1 {
		t.Errorf("the other Service's health check: %d, %v; want served with 1 endpoint", n, ok)
	}
	// Once the port is free, the next sync opens it.
	busy.Close()
	s.Sync(st)
	if _, ok := s.LocalEndpoints(types.NamespacedName{Namespace: "ns", Name: "lb"}, proxy.IPv4); !ok {
		t.Error("health check port not opened after the port became free")
	}
}

func TestHealthCheckAddrsFollowNodePortAddresses(t *testing.T) {
	node := proxy.Node{Name: "n", IPs: []netip.Addr{netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("fd00::10")}}
	local := func() ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("fd00::10")}, nil
	}
	log := slog.New(slog.DiscardHandler)
	tests := []struct {
		name    string
		family  proxy.Family
		cidrs   []string
		primary bool
		want    string
	}{
		{"unset: every address", proxy.IPv4, nil, false, "[0.0.0.0]"},
		{"unset: every IPv6 address", proxy.IPv6, nil, false, "[::]"},
		{"primary: the node's primary IP", proxy.IPv4, nil, true, "[192.168.1.10]"},
		{"primary IPv6", proxy.IPv6, nil, true, "[fd00::10]"},
		{"CIDRs: the local addresses inside them", proxy.IPv4, []string{"10.0.0.0/8"}, false, "[10.1.2.3]"},
		{"CIDRs of the other family only: every address", proxy.IPv6, []string{"10.0.0.0/8"}, false, "[::]"},
		{"zero CIDR: every address", proxy.IPv4, []string{"0.0.0.0/0"}, false, "[0.0.0.0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cidrs []netip.Prefix
			for _, c := range tt.cidrs {
				cidrs = append(cidrs, netip.MustParsePrefix(c))
			}
			got := healthCheckAddrs(tt.family, node, cidrs, tt.primary, local, log)
			if fmtAddrs(got) != tt.want {
				t.Errorf("got %v, want %s", got, tt.want)
			}
		})
	}
}

func fmtAddrs(as []netip.Addr) string {
	var parts []string
	for _, a := range as {
		parts = append(parts, a.String())
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func freePort(t *testing.T) int32 {
	t.Helper()
	return int32(netip.MustParseAddrPort(freeAddr(t)).Port())
}

func httpCode(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// With NodePortScope, the listeners follow the running mode's
// --nodeport-addresses at each Sync: after a switch from nftables mode
// (the Node's primary IP) to iptables mode (every address), a health check
// port listens where a kp started in iptables mode listens.
func TestServiceHealthPortsFollowTheRunningModesNodePortAddresses(t *testing.T) {
	primary := true
	var listened []string
	s := NewServiceHealthServer(ServiceHealthOptions{
		NodePortScope: func() ([]netip.Prefix, bool) { return nil, primary },
		Listen: func(network, addr string) (net.Listener, error) {
			listened = append(listened, network+" "+addr)
			return net.Listen("tcp", "127.0.0.1:0")
		}})
	defer s.Close()
	st := hcState(32000, nodeEp("10.0.0.1", "node-a", true))
	st.Node.IPs = []netip.Addr{netip.MustParseAddr("192.168.1.10")}
	s.Sync(st)
	primary = false // the switch
	s.Sync(st)
	want := "[tcp4 192.168.1.10:32000 tcp6 [::]:32000 tcp4 0.0.0.0:32000]"
	if got := fmt.Sprint(listened); got != want {
		t.Errorf("listened on %s, want %s", got, want)
	}
}
