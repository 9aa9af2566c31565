package proxy

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
)

func TestExplainEndpointsGivesEachEndpointTheRuleThatDecidedIt(t *testing.T) {
	node := Node{Name: "node-a", Labels: map[string]string{v1.LabelTopologyZone: "zone-a"}}
	ep := func(ip, nodeName, zone string, ready, serving, terminating bool) Endpoint {
		return Endpoint{IP: netip.MustParseAddr(ip), Port: 80, Ready: ready, Serving: serving, Terminating: terminating}.At(nodeName, zone)
	}
	type want struct {
		chosen bool
		reason EndpointReason
	}
	tests := []struct {
		name     string
		sp       *ServicePort
		eps      []Endpoint
		local    bool // read the Local policy's choices
		want     []want
		topology string
	}{
		{name: "ready endpoints are chosen, terminating ones wait, not ready ones never",
			sp: &ServicePort{},
			eps: []Endpoint{ep("10.0.0.1", "node-b", "", true, true, false), ep("10.0.0.2", "node-b", "", false, true, true),
				ep("10.0.0.3", "node-b", "", false, false, false)},
			want: []want{{true, ReasonReady}, {false, ReasonTerminating}, {false, ReasonNotReady}}},
		{name: "serving terminating endpoints are the fallback when none is ready",
			sp:   &ServicePort{},
			eps:  []Endpoint{ep("10.0.0.1", "node-b", "", false, true, true), ep("10.0.0.2", "node-b", "", false, false, true)},
			want: []want{{true, ReasonTerminatingFallback}, {false, ReasonNotReady}}},
		{name: "the Local policy refuses other nodes' endpoints",
			sp:    &ServicePort{InternalPolicyLocal: true},
			eps:   []Endpoint{ep("10.0.0.1", "node-a", "", true, true, false), ep("10.0.0.2", "node-b", "", true, true, false)},
			local: true,
			want:  []want{{true, ReasonReady}, {false, ReasonNotLocal}}},
		{name: "trafficDistribution PreferClose keeps the zone's endpoints",
			sp:       &ServicePort{TrafficDistribution: v1.ServiceTrafficDistributionPreferClose},
			eps:      []Endpoint{ep("10.0.0.1", "node-b", "zone-a", true, true, false), ep("10.0.0.2", "node-c", "zone-b", true, true, false)},
			want:     []want{{true, ReasonReady}, {false, ReasonOtherZone}},
			topology: "zone"},
		{name: "PreferSameNode keeps this node's endpoints",
			sp:       &ServicePort{TrafficDistribution: v1.ServiceTrafficDistributionPreferSameNode},
			eps:      []Endpoint{ep("10.0.0.1", "node-a", "zone-a", true, true, false), ep("10.0.0.2", "node-b", "zone-a", true, true, false)},
			want:     []want{{true, ReasonReady}, {false, ReasonOtherNode}},
			topology: "node"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pc := ExplainEndpoints(tc.sp, tc.eps, node)
			got := pc.Cluster
			if tc.local {
				got = pc.Local
			}
			if len(got) != len(tc.want) {
				t.Fatalf("%d choices, want %d", len(got), len(tc.want))
			}
			chosen := map[netip.AddrPort]bool{}
			for _, e := range append(pc.Selection.Cluster, pc.Selection.Local...) {
				chosen[e.AddrPort()] = true
			}
			for i, w := range tc.want {
				if got[i].Chosen != w.chosen || got[i].Reason != w.reason {
					t.Errorf("%s: chosen %t %s (%s), want %t %s", got[i].Endpoint, got[i].Chosen, got[i].Reason, got[i].Detail, w.chosen, w.reason)
				}
				if got[i].Chosen != chosen[got[i].Endpoint.AddrPort()] {
					t.Errorf("%s: chosen %t, but SelectEndpoints says %t", got[i].Endpoint, got[i].Chosen, !got[i].Chosen)
				}
			}
			if pc.Topology != tc.topology {
				t.Errorf("topology %q (%s), want %q", pc.Topology, pc.TopologyDetail, tc.topology)
			}
		})
	}
}
