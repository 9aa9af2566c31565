package server

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/proxytest"
	"github.com/kpproxy/kp/proxy/statetest"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// recordingObserver records each Synced call as "prev→cur" generations.
type recordingObserver struct{ calls chan [2]uint64 }

func (r *recordingObserver) Synced(_ context.Context, prev, cur *proxy.State) {
	var p uint64
	if prev != nil {
		p = prev.Generation
	}
	r.calls <- [2]uint64{p, cur.Generation}
}

func TestObserversSeeEverySuccessfulSyncWithThePreviousOne(t *testing.T) {
	obs := &recordingObserver{calls: make(chan [2]uint64, 10)}
	backend := newFakeBackend(0)
	src := &fakeSource{initial: func(s proxy.Sink) { proxytest.AddService(s, proxytest.Service("ns", "web")) }, updates: make(chan func(proxy.Sink))}
	clk, _ := startRunWith(t, testConfig(), RunOptions{Backend: backend, Sources: []proxy.Source{src}, Observers: []proxy.SyncObserver{obs}})
	backend.expectSync(t)
	if got := <-obs.calls; got != [2]uint64{0, 1} {
		t.Errorf("first observation %v, want no previous state and generation 1", got)
	}
	// A failed sync is not observed; the next success sees the last
	// success as its previous state.
	backend.mu.Lock()
	backend.failures = 1
	backend.mu.Unlock()
	src.updates <- func(s proxy.Sink) { s.OnService("ns", "web", nil) }
	backend.stepUntilSync(t, clk, time.Second)
	backend.stepUntilSync(t, clk, time.Second)
	select {
	case got := <-obs.calls:
		if got != [2]uint64{1, 3} {
			t.Errorf("observation after a failed sync %v, want 1→3", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the retried sync was not observed")
	}
}

// countingBackend is a backend that counts connections per endpoint.
type countingBackend struct {
	fakeBackend
	counters map[proxy.EndpointRef]proxy.EndpointCounter
	err      error
}

func (c *countingBackend) EndpointCounters(*proxy.State) (map[proxy.EndpointRef]proxy.EndpointCounter, error) {
	return c.counters, c.err
}

func statusTestState() *proxy.State {
	web := statetest.PortName("ns", "web", "dns", v1.ProtocolUDP)
	other := statetest.PortName("other", "api", "", v1.ProtocolTCP)
	return &proxy.State{
		Generation: 4,
		Node:       proxy.Node{Name: "node-a", IPs: proxytest.Addrs("192.168.1.10"), Labels: map[string]string{v1.LabelTopologyZone: "z1"}},
		Services: map[proxy.ServicePortName]*proxy.ServicePort{
			web: {Name: web, Type: v1.ServiceTypeNodePort, ClusterIPs: proxytest.Addrs("10.96.0.10", "fd00:96::10"), Port: 53,
				Protocol: v1.ProtocolUDP, NodePort: 30053, ExternalIPs: proxytest.Addrs("203.0.113.5"), ExternalPolicyLocal: true},
			other: {Name: other, Type: v1.ServiceTypeClusterIP, ClusterIPs: proxytest.Addrs("10.96.0.20"), Port: 80, Protocol: v1.ProtocolTCP},
		},
		Endpoints: map[proxy.ServicePortName][]proxy.Endpoint{
			web: {statetest.Endpoint("10.244.1.2:5353"), statetest.Endpoint("10.244.1.3:5353", statetest.Terminating)},
		},
	}
}

func TestStatusAPIReportsSyncsServicesAndCounters(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	st := statusTestState()
	web := statetest.PortName("ns", "web", "dns", v1.ProtocolUDP)
	backend := &countingBackend{counters: map[proxy.EndpointRef]proxy.EndpointCounter{
		{ServicePort: web, Endpoint: netip.MustParseAddrPort("10.244.1.2:5353")}: {Packets: 7, Bytes: 420},
	}}
	s := NewStatus(backend, "node-a", nil, clk)
	s.Failed(clk.Now(), errors.New("sync nftables generation 3: netlink: permission denied"))
	s.Succeeded(st, clk.Now(), clk.Now().Add(20*time.Millisecond), true)
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	c := &statusapi.Client{BaseURL: srv.URL}

	status, err := c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if status.APIVersion != "kp/v1" || status.Mode != "nftables" || status.Node != "node-a" ||
		status.Syncs != (statusapi.SyncCounts{Succeeded: 1, Failed: 1, Full: 1}) ||
		status.LastSync == nil || status.LastSync.Generation != 4 || status.LastSync.DurationSeconds != 0.02 ||
		status.LastError == nil || !strings.Contains(status.LastError.Message, "permission denied") ||
		status.ServicePorts != 2 || status.Endpoints != 2 {
		t.Errorf("status: %+v", status)
	}

	all, err := c.Services(context.Background(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(all.ServicePorts) != 2 || all.ServicePorts[0].Namespace != "ns" || all.ServicePorts[1].Namespace != "other" {
		t.Fatalf("services not sorted by namespace: %+v", all.ServicePorts)
	}
	got := all.ServicePorts[0]
	if got.NodePort != 30053 || got.ExternalTrafficPolicy != "Local" || len(got.ClusterIPs) != 2 || len(got.Endpoints) != 2 {
		t.Errorf("web: %+v", got)
	}
	ready, term := got.Endpoints[0], got.Endpoints[1]
	if !ready.Usable || ready.Counters == nil || ready.Counters.NewConnections != 7 || ready.Counters.Bytes != 420 {
		t.Errorf("ready endpoint: %+v (counters %+v)", ready, ready.Counters)
	}
	// Ready endpoints exist, so the terminating one takes no new
	// connections and has no counter.
	if term.Usable || !term.Terminating || term.Counters != nil {
		t.Errorf("terminating endpoint: %+v", term)
	}
	if all.Node.Zone != "z1" || all.Generation != 4 {
		t.Errorf("node %+v generation %d", all.Node, all.Generation)
	}

	filtered, err := c.Services(context.Background(), "other", "api")
	if err != nil || len(filtered.ServicePorts) != 1 || filtered.ServicePorts[0].Name != "api" {
		t.Errorf("filtered by namespace and service: %+v, %v", filtered, err)
	}
	if none, _ := c.Services(context.Background(), "ns", "api"); len(none.ServicePorts) != 0 {
		t.Errorf("filter matching nothing: %+v", none.ServicePorts)
	}

	backend.err = errors.New("netlink: no such table")
	if r := s.ServicesReport("", ""); r.CountersError == "" || r.ServicePorts[0].Endpoints[0].Counters != nil {
		t.Errorf("counter failure not reported: %q", r.CountersError)
	}
}

func TestStatusAPIBeforeTheFirstSyncIsEmptyNotAnError(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	s := NewStatus(newFakeBackend(0), "node-a", NewHealth(time.Minute, clk), clk)
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", statusapi.ServicesPath, nil))
	var r statusapi.Services
	if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil || rec.Code != 200 || r.ServicePorts == nil || len(r.ServicePorts) != 0 {
		t.Errorf("GET services before a sync: %d %s (%v)", rec.Code, rec.Body, err)
	}
	if rep := s.Report(); rep.LastSync != nil || rep.Healthy {
		t.Errorf("status before a sync: %+v", rep)
	}
}

func TestStateFromServicesRebuildsWhatTheAPIReported(t *testing.T) {
	st := statusTestState()
	clk := clocktesting.NewFakeClock(time.Now())
	s := NewStatus(newFakeBackend(0), "node-a", nil, clk)
	s.Succeeded(st, clk.Now(), clk.Now(), true)
	b, _ := json.Marshal(s.ServicesReport("", ""))
	var r statusapi.Services
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	got, err := statusapi.StateFromServices(&r)
	if err != nil {
		t.Fatal(err)
	}
	for name, sp := range st.Services {
		g := got.Services[name]
		if g == nil {
			t.Errorf("%s missing", name)
			continue
		}
		if !g.Equal(sp) {
			t.Errorf("%s: got %+v, want %+v", name, g, sp)
		}
		if !reflect.DeepEqual(got.Endpoints[name], st.Endpoints[name]) {
			t.Errorf("%s endpoints: got %+v, want %+v", name, got.Endpoints[name], st.Endpoints[name])
		}
	}
	if !reflect.DeepEqual(got.Node.IPs, st.Node.IPs) || got.Node.Zone() != "z1" {
		t.Errorf("node: %+v", got.Node)
	}

	r.ServicePorts[0].Endpoints[0].IP = "10.244.1.x"
	if _, err := statusapi.StateFromServices(&r); err == nil || !strings.Contains(err.Error(), "endpoints[0].ip") {
		t.Errorf("bad endpoint IP: %v", err)
	}
}

func TestStatusUsableFollowsTheRulesSelection(t *testing.T) {
	node := proxy.Node{Name: "node-a", Labels: map[string]string{v1.LabelTopologyZone: "zone-a"}}
	ep := func(ip, zone string) proxy.Endpoint {
		return proxy.Endpoint{IP: netip.MustParseAddr(ip), Port: 80, Ready: true, Serving: true, Hints: &proxy.EndpointHints{ForZones: []string{zone}}}.At("node-b", zone)
	}
	sp := &proxy.ServicePort{Name: statetest.PortName("ns", "web", "http", "TCP"), Type: v1.ServiceTypeClusterIP,
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")}, Port: 80, Protocol: v1.ProtocolTCP}
	r := servicePortReport(sp, []proxy.Endpoint{ep("10.0.0.1", "zone-a"), ep("10.0.0.2", "zone-b")}, node, nil, false)
	got := map[string]bool{}
	for _, e := range r.Endpoints {
		got[e.IP] = e.Usable
	}
	if !got["10.0.0.1"] || got["10.0.0.2"] {
		t.Errorf("usable = %v; want only the endpoint hinted for the node's zone", got)
	}
}

func TestStatusAPIReportsHowTheModeWasChosen(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	s := NewStatus(newFakeBackend(0), "node-a", nil, clk)
	if rep := s.Report(); rep.ModeChoice != nil {
		t.Errorf("mode choice before it was set: %+v", rep.ModeChoice)
	}
	s.SetModeChoice(&statusapi.ModeChoice{From: "auto", Auto: true,
		Refused: []statusapi.RefusedMode{{Mode: "nftables", Reason: "the kernel has no nf_tables"}}})
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", statusapi.StatusPath, nil))
	var r statusapi.Status
	if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	if c := r.ModeChoice; c == nil || !c.Auto || c.From != "auto" || len(c.Refused) != 1 ||
		c.Refused[0] != (statusapi.RefusedMode{Mode: "nftables", Reason: "the kernel has no nf_tables"}) {
		t.Errorf("modeChoice %+v in %s", c, rec.Body)
	}
}
