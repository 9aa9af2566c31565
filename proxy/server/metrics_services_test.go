package server

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/proxytest"
	"github.com/kpproxy/kp/proxy/statetest"
	v1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestNoLocalEndpointsCountsLocalPoliciesWithoutLocalEndpoints(t *testing.T) {
	st := &proxy.State{Services: map[proxy.ServicePortName]*proxy.ServicePort{}, Endpoints: map[proxy.ServicePortName][]proxy.Endpoint{},
		Node: proxy.Node{Name: "node-a"}}
	add := func(name string, mut func(*proxy.ServicePort), eps ...proxy.Endpoint) {
		sp := testPort("ns", name, mut)
		sp.ClusterIPs = proxytest.Addrs("10.96.0.10", "fd00::10")
		st.Services[sp.Name] = sp
		st.Endpoints[sp.Name] = eps
	}
	itp := func(sp *proxy.ServicePort) { sp.InternalPolicyLocal = true }
	etp := func(sp *proxy.ServicePort) { sp.ExternalPolicyLocal = true; sp.NodePort = 30000 }
	both := func(sp *proxy.ServicePort) { itp(sp); etp(sp) }
	add("itp-remote-only", itp, nodeEp("10.0.0.1", "node-b", true))
	add("etp-remote-only", etp, nodeEp("10.0.0.1", "node-b", true), nodeEp("fd00::a", "node-b", true))
	add("both-remote-v6", both, nodeEp("10.0.0.1", "node-a", true), nodeEp("fd00::a", "node-b", true))
	add("itp-local", itp, nodeEp("10.0.0.1", "node-a", true))
	add("itp-local-terminating", itp, proxy.Endpoint{IP: netip.MustParseAddr("10.0.0.1"), Serving: true, Terminating: true}.At("node-a", ""))
	add("itp-no-endpoints", itp) // rejected, not counted (as upstream)
	add("cluster-remote", func(*proxy.ServicePort) {}, nodeEp("10.0.0.1", "node-b", true))

	got := noLocalEndpoints(st, proxy.NewPortSet(localPolicy).Update(st))
	want := map[proxy.Family]policyCounts{proxy.IPv4: {internal: 1, external: 1}, proxy.IPv6: {internal: 1, external: 2}}
	if got[proxy.IPv4] != want[proxy.IPv4] || got[proxy.IPv6] != want[proxy.IPv6] {
		t.Errorf("noLocalEndpoints = %+v, want %+v", got, want)
	}

	m := NewMetrics(proxy.ModeNFTables)
	m.ObserveState(st)
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	text := string(get(t, srv.URL+"/metrics", http.StatusOK))
	for _, line := range []string{
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="internal"} 1`,
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv6",traffic_policy="external"} 2`,
	} {
		if !strings.Contains(text, line) {
			t.Errorf("/metrics lacks %s", line)
		}
	}
}

func TestChangeCountersFollowTheTracker(t *testing.T) {
	tr, _ := newTestTracker(t, nil)
	m := NewMetrics(proxy.ModeNFTables)
	m.ObserveTracker(tr)
	proxytest.AddService(tr, proxytest.Service("ns", "web"))
	proxytest.AddService(tr, proxytest.Service("ns", "web")) // no-op: not a change
	proxytest.AddService(tr, proxytest.Service("ns", "api", func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.11", nil }))
	proxytest.AddSlice(tr, proxytest.Slice("ns", "web-1", "web", []string{"10.0.0.1"}))
	c := tr.ChangeCounts()
	if c != (proxy.ChangeCounts{ServicesTotal: 2, EndpointsTotal: 1, ServicesPending: 2, EndpointsPending: 1}) {
		t.Errorf("before a snapshot: %+v", c)
	}
	tr.Snapshot()
	if c := tr.ChangeCounts(); c.ServicesPending != 0 || c.EndpointsPending != 0 || c.ServicesTotal != 2 {
		t.Errorf("after a snapshot: %+v", c)
	}
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	text := string(get(t, srv.URL+"/metrics", http.StatusOK))
	for _, line := range []string{
		"kubeproxy_sync_proxy_rules_service_changes_total 2",
		"kubeproxy_sync_proxy_rules_endpoint_changes_total 1",
		"kubeproxy_sync_proxy_rules_service_changes_pending 0",
		"kubeproxy_sync_proxy_rules_endpoint_changes_pending 0",
	} {
		if !strings.Contains(text, line) {
			t.Errorf("/metrics lacks %s", line)
		}
	}
}

func TestHealthResponsesAreCounted(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	h := NewHealth(time.Minute, clk)
	m := NewMetrics(proxy.ModeNFTables)
	m.ObserveHealth(h)
	hs := httptest.NewServer(h.Handler())
	defer hs.Close()
	get(t, hs.URL+"/healthz", http.StatusServiceUnavailable)
	h.Updated(clk.Now())
	get(t, hs.URL+"/healthz", http.StatusOK)
	get(t, hs.URL+"/livez", http.StatusOK)
	ms := httptest.NewServer(m.Handler())
	defer ms.Close()
	text := string(get(t, ms.URL+"/metrics", http.StatusOK))
	for _, line := range []string{
		`kubeproxy_proxy_healthz_total{code="503"} 1`,
		`kubeproxy_proxy_healthz_total{code="200"} 1`,
		`kubeproxy_proxy_livez_total{code="200"} 1`,
	} {
		if !strings.Contains(text, line) {
			t.Errorf("/metrics lacks %s", line)
		}
	}
}

// The gauge follows a port into and out of a Local policy from one synced
// State to the next, where only Changed is looked at, and again after a
// State it never saw (a failed sync).
func TestNoLocalEndpointsFollowsPolicyChanges(t *testing.T) {
	w := statetest.New(statetest.Node("node-a", "192.168.0.10"))
	name := statetest.PortName("ns", "web", "http", "")
	m := NewMetrics(proxy.ModeNFTables)
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	const line = `kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="internal"} `
	step := func(local bool, observe bool, want string) {
		t.Helper()
		w.AddService(name, "10.96.0.10", 80, 0, "10.0.0.1:8080").InternalPolicyLocal = local
		w.AddService(statetest.PortName("ns", "other", "http", ""), "10.96.0.11", 80, 0, "10.0.0.2:8080")
		st := w.Next()
		if !observe {
			return
		}
		m.ObserveState(st)
		if text := string(get(t, srv.URL+"/metrics", http.StatusOK)); !strings.Contains(text, line+want+"\n") {
			t.Errorf("generation %d: /metrics lacks %s%s", st.Generation, line, want)
		}
	}
	step(false, true, "0")
	step(true, true, "1")
	step(false, true, "0")
	step(true, false, "")
	step(true, true, "1")
}
