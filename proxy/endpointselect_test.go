package proxy

import (
	"net/netip"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
)

func TestSelectEndpoints(t *testing.T) {
	node := Node{Name: "node-a", Labels: map[string]string{v1.LabelTopologyZone: "zone-a"}}
	ep := func(ip string, mods ...func(*Endpoint)) Endpoint {
		e := Endpoint{IP: netip.MustParseAddr(ip), Port: 80, Ready: true, Serving: true}.At("node-b", "zone-b")
		for _, m := range mods {
			m(&e)
		}
		return e
	}
	local := func(e *Endpoint) { *e = e.At("node-a", "zone-a") }
	terminating := func(e *Endpoint) { e.Ready, e.Terminating = false, true }
	notServing := func(e *Endpoint) { e.Ready, e.Serving, e.Terminating = false, false, true }
	notReady := func(e *Endpoint) { e.Ready, e.Serving = false, false }
	hints := func(e *Endpoint) *EndpointHints {
		h := &EndpointHints{}
		if e.Hints != nil {
			*h = *e.Hints
		}
		e.Hints = h
		return h
	}
	zones := func(z ...string) func(*Endpoint) { return func(e *Endpoint) { hints(e).ForZones = z } }
	nodes := func(n ...string) func(*Endpoint) { return func(e *Endpoint) { hints(e).ForNodes = n } }

	cluster := &ServicePort{Type: v1.ServiceTypeClusterIP}
	itpLocal := &ServicePort{Type: v1.ServiceTypeClusterIP, InternalPolicyLocal: true}
	etpLocal := &ServicePort{Type: v1.ServiceTypeNodePort, NodePort: 30000, ExternalPolicyLocal: true}
	preferClose := &ServicePort{Type: v1.ServiceTypeClusterIP, TrafficDistribution: v1.ServiceTrafficDistributionPreferClose}
	preferNode := &ServicePort{Type: v1.ServiceTypeClusterIP, TrafficDistribution: v1.ServiceTrafficDistributionPreferSameNode}

	tests := []struct {
		name          string
		sp            *ServicePort
		eps           []Endpoint
		cluster, locl []string
		usable        bool
	}{
		{name: "no endpoints: nothing usable", sp: cluster},
		{name: "ready endpoints all go to the cluster policy", sp: cluster,
			eps:     []Endpoint{ep("10.0.0.1"), ep("10.0.0.2", local)},
			cluster: []string{"10.0.0.1", "10.0.0.2"}, usable: true},
		{name: "not ready and not serving endpoints are never used", sp: cluster,
			eps: []Endpoint{ep("10.0.0.1", notReady), ep("10.0.0.2", notServing)}},
		{name: "terminating endpoints are used only when none is ready", sp: cluster,
			eps:     []Endpoint{ep("10.0.0.1", terminating), ep("10.0.0.2")},
			cluster: []string{"10.0.0.2"}, usable: true},
		{name: "serving and terminating endpoints when none is ready", sp: cluster,
			eps:     []Endpoint{ep("10.0.0.1", terminating), ep("10.0.0.2", notServing), ep("10.0.0.3", notReady)},
			cluster: []string{"10.0.0.1"}, usable: true},
		{name: "internalTrafficPolicy Local uses only this node's endpoints", sp: itpLocal,
			eps:  []Endpoint{ep("10.0.0.1"), ep("10.0.0.2", local)},
			locl: []string{"10.0.0.2"}, usable: true},
		{name: "internalTrafficPolicy Local with no local endpoint: usable elsewhere, so dropped not rejected", sp: itpLocal,
			eps: []Endpoint{ep("10.0.0.1")}, usable: true},
		{name: "local terminating fallback is independent of the cluster's", sp: etpLocal,
			eps:     []Endpoint{ep("10.0.0.1"), ep("10.0.0.2", local, terminating)},
			cluster: []string{"10.0.0.1"}, locl: []string{"10.0.0.2"}, usable: true},
		{name: "externalTrafficPolicy Local keeps the cluster policy for internal traffic", sp: etpLocal,
			eps:     []Endpoint{ep("10.0.0.1"), ep("10.0.0.2", local)},
			cluster: []string{"10.0.0.1", "10.0.0.2"}, locl: []string{"10.0.0.2"}, usable: true},
		{name: "zone hints for this zone narrow the cluster endpoints", sp: cluster,
			eps:     []Endpoint{ep("10.0.0.1", zones("zone-b")), ep("10.0.0.2", zones("zone-a")), ep("10.0.0.3", zones("zone-a", "zone-b"))},
			cluster: []string{"10.0.0.2", "10.0.0.3"}, usable: true},
		{name: "incomplete zone hints are ignored", sp: cluster,
			eps:     []Endpoint{ep("10.0.0.1", zones("zone-b")), ep("10.0.0.2", zones("zone-a")), ep("10.0.0.3")},
			cluster: []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}, usable: true},
		{name: "zone hints that name no endpoint for this zone are ignored", sp: cluster,
			eps:     []Endpoint{ep("10.0.0.1", zones("zone-b")), ep("10.0.0.2", zones("zone-c"))},
			cluster: []string{"10.0.0.1", "10.0.0.2"}, usable: true},
		{name: "hints of unready endpoints do not count", sp: cluster,
			eps:     []Endpoint{ep("10.0.0.1", zones("zone-b")), ep("10.0.0.2", zones("zone-a")), ep("10.0.0.3", notReady)},
			cluster: []string{"10.0.0.2"}, usable: true},
		{name: "node hints win over zone hints", sp: cluster,
			eps:     []Endpoint{ep("10.0.0.1", zones("zone-a"), nodes("node-c")), ep("10.0.0.2", zones("zone-a"), nodes("node-a"))},
			cluster: []string{"10.0.0.2"}, usable: true},
		{name: "topology with no ready endpoint falls back to terminating ones anywhere", sp: cluster,
			eps:     []Endpoint{ep("10.0.0.1", zones("zone-b"), terminating), ep("10.0.0.2", zones("zone-a"), terminating)},
			cluster: []string{"10.0.0.1", "10.0.0.2"}, usable: true},
		{name: "PreferClose without hints (no controller) prefers this zone", sp: preferClose,
			eps:     []Endpoint{ep("10.0.0.1"), ep("10.0.0.2", local)},
			cluster: []string{"10.0.0.2"}, usable: true},
		{name: "PreferClose without an endpoint in this zone uses all", sp: preferClose,
			eps:     []Endpoint{ep("10.0.0.1"), ep("10.0.0.2")},
			cluster: []string{"10.0.0.1", "10.0.0.2"}, usable: true},
		{name: "PreferClose follows the controller's hints when there are some", sp: preferClose,
			eps:     []Endpoint{ep("10.0.0.1", zones("zone-a")), ep("10.0.0.2", local, zones("zone-b"))},
			cluster: []string{"10.0.0.1"}, usable: true},
		{name: "PreferSameNode without hints prefers this node", sp: preferNode,
			eps:     []Endpoint{ep("10.0.0.1", func(e *Endpoint) { *e = e.At(e.NodeName(), "zone-a") }), ep("10.0.0.2", local)},
			cluster: []string{"10.0.0.2"}, usable: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sel := SelectEndpoints(tt.sp, tt.eps, node)
			if got := ips(sel.Cluster); !slices.Equal(got, tt.cluster) {
				t.Errorf("Cluster = %v, want %v", got, tt.cluster)
			}
			if got := ips(sel.Local); !slices.Equal(got, tt.locl) {
				t.Errorf("Local = %v, want %v", got, tt.locl)
			}
			if sel.Usable != tt.usable {
				t.Errorf("Usable = %v, want %v", sel.Usable, tt.usable)
			}
		})
	}
}

func ips(eps []Endpoint) []string {
	var out []string
	for _, e := range eps {
		out = append(out, e.IP.String())
	}
	return out
}
