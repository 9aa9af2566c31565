package proxy

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestNoLocalEndpointsCountsLocalPoliciesWithoutLocalEndpoints(t *testing.T) {
	st := &State{Services: map[ServicePortName]*ServicePort{}, Endpoints: map[ServicePortName][]Endpoint{},
		Node: Node{Name: "node-a"}}
	add := func(name string, mut func(*ServicePort), eps ...Endpoint) {
		sp := testPort("ns", name, mut)
		sp.ClusterIPs = addrs("10.96.0.10", "fd00::10")
		st.Services[sp.Name] = sp
		st.Endpoints[sp.Name] = eps
	}
	itp := func(sp *ServicePort) { sp.InternalPolicyLocal = true }
	etp := func(sp *ServicePort) { sp.ExternalPolicyLocal = true; sp.NodePort = 30000 }
	both := func(sp *ServicePort) { itp(sp); etp(sp) }
	add("itp-remote-only", itp, nodeEp("10.0.0.1", "node-b", true))
	add("etp-remote-only", etp, nodeEp("10.0.0.1", "node-b", true), nodeEp("fd00::a", "node-b", true))
	add("both-remote-v6", both, nodeEp("10.0.0.1", "node-a", true), nodeEp("fd00::a", "node-b", true))
	add("itp-local", itp, nodeEp("10.0.0.1", "node-a", true))
	add("itp-local-terminating", itp, Endpoint{IP: netip.MustParseAddr("10.0.0.1"), Serving: true, Terminating: true}.At("node-a", ""))
	add("itp-no-endpoints", itp) // rejected, not counted (as upstream)
	add("cluster-remote", func(*ServicePort) {}, nodeEp("10.0.0.1", "node-b", true))

	got := noLocalEndpoints(st)
	want := map[Family]policyCounts{IPv4: {internal: 1, external: 1}, IPv6: {internal: 1, external: 2}}
	if got[IPv4] != want[IPv4] || got[IPv6] != want[IPv6] {
		t.Errorf("noLocalEndpoints = %+v, want %+v", got, want)
	}

	m := NewMetrics(ModeNFTables)
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
	m := NewMetrics(ModeNFTables)
	m.ObserveTracker(tr)
	addService(tr, testService("ns", "web"))
	addService(tr, testService("ns", "web")) // no-op: not a change
	addService(tr, testService("ns", "api", func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.11", nil }))
	addSlice(tr, testSlice("ns", "web-1", "web", []string{"10.0.0.1"}))
	c := tr.ChangeCounts()
	if c != (ChangeCounts{ServicesTotal: 2, EndpointsTotal: 1, ServicesPending: 2, EndpointsPending: 1}) {
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
	m := NewMetrics(ModeNFTables)
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
