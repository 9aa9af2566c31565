package proxy

import (
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
)

// EndpointSelection is where one ServicePort's new connections may go from
// this node, by upstream kube-proxy's rules (CategorizeEndpoints).
type EndpointSelection struct {
	// Cluster is for traffic under the Cluster policy: the ready
	// endpoints, narrowed by topology hints when they apply; when no
	// endpoint is ready anywhere, the serving and terminating ones (so a
	// rolling update's last pods keep answering). Empty when the
	// ServicePort never uses the Cluster policy.
	Cluster []Endpoint
	// Local is for traffic under the Local policy: this node's ready
	// endpoints, else its serving and terminating ones. Empty when the
	// ServicePort never uses the Local policy.
	Local []Endpoint
	// Usable reports whether some endpoint anywhere is ready, or serving
	// and terminating. When it is false new connections are rejected at
	// once; when it is true but a policy's list is empty, that policy's
	// traffic is dropped, as upstream does.
	Usable bool
}

// UsesClusterEndpoints reports whether some of the port's traffic follows
// the Cluster policy (internal traffic with internalTrafficPolicy Cluster,
// or external traffic with externalTrafficPolicy Cluster).
func (sp *ServicePort) UsesClusterEndpoints() bool {
	return !sp.InternalPolicyLocal || (sp.HasExternal() && !sp.ExternalPolicyLocal)
}

// UsesLocalEndpoints reports whether some of the port's traffic follows the
// Local policy.
func (sp *ServicePort) UsesLocalEndpoints() bool {
	return sp.InternalPolicyLocal || (sp.HasExternal() && sp.ExternalPolicyLocal)
}

// SelectEndpoints splits eps (one ServicePort's endpoints, as in
// State.Endpoints) by traffic policy for the proxy running on node.
// Endpoints that are neither ready nor serving-and-terminating are never
// selected. The result's lists keep the order of eps.
func SelectEndpoints(sp *ServicePort, eps []Endpoint, node Node) EndpointSelection {
	var sel EndpointSelection
	if len(eps) == 0 {
		return sel
	}
	for _, e := range eps {
		if e.Ready || (e.Serving && e.Terminating) {
			sel.Usable = true
			break
		}
	}
	if sp.UsesClusterEndpoints() {
		hinted := derivedHints(sp, eps)
		mode := topologyMode(hinted, node)
		sel.Cluster = readyOrTerminating(eps, func(i int) bool { return mode.allows(hinted[i], node) })
	}
	if sp.UsesLocalEndpoints() {
		sel.Local = readyOrTerminating(eps, func(i int) bool { return eps[i].NodeName() == node.Name })
	}
	return sel
}

// Selected reports, for each endpoint of eps, whether some traffic of the
// port's may be sent to it from node: SelectEndpoints per family, Cluster and
// Local together.
func Selected(sp *ServicePort, eps []Endpoint, node Node) map[netip.AddrPort]bool {
	out := map[netip.AddrPort]bool{}
	for _, f := range []Family{IPv4, IPv6} {
		sel := SelectEndpoints(sp, FilterEndpoints(f, eps), node)
		for _, e := range append(sel.Cluster, sel.Local...) {
			out[e.AddrPort()] = true
		}
	}
	return out
}

// UsableEndpoints returns the endpoints that may receive new connections
// under the Cluster policy without topology: every ready endpoint; when none
// is ready, the serving and terminating ones.
func UsableEndpoints(eps []Endpoint) []Endpoint {
	return readyOrTerminating(eps, func(int) bool { return true })
}

// readyOrTerminating returns the ready endpoints whose index keep passes;
// when there is none, the serving and terminating ones whose index it passes. Topology needs
// no second chance here: topologyMode already ignores hints that would leave
// no ready endpoint.
func readyOrTerminating(eps []Endpoint, keep func(i int) bool) []Endpoint {
	ready, terminating := 0, 0
	for i, e := range eps {
		switch {
		case !keep(i):
		case e.Ready:
			ready++
		case e.Serving && e.Terminating:
			terminating++
		}
	}
	if ready == len(eps) {
		// Every endpoint, the usual case: eps itself, capped so that an
		// append copies (endpoint lists are shared, never written).
		return eps[:ready:ready]
	}
	n, pick := ready, func(e Endpoint) bool { return e.Ready }
	if ready == 0 {
		n, pick = terminating, func(e Endpoint) bool { return !e.Ready && e.Serving && e.Terminating }
	}
	if n == 0 {
		return nil
	}
	out := make([]Endpoint, 0, n)
	for i, e := range eps {
		if pick(e) && keep(i) {
			out = append(out, e)
		}
	}
	return out
}

// topology is how hints narrow the Cluster policy's endpoints.
type topology int

const (
	topologyNone topology = iota
	topologySameZone
	topologySameNode
)

func (t topology) allows(e Endpoint, node Node) bool {
	switch t {
	case topologySameNode:
		return slices.Contains(e.NodeHints(), node.Name)
	case topologySameZone:
		return slices.Contains(e.ZoneHints(), node.Zone())
	}
	return true
}

// topologyMode decides, as upstream does, whether the hints apply: node hints
// when every ready endpoint has one and some endpoint is hinted for this
// node; else zone hints when every ready endpoint has one and some endpoint
// is hinted for this node's zone; else none (incomplete hints are ignored
// rather than followed part way).
func topologyMode(eps []Endpoint, node Node) topology {
	var ready, allNode, forNode, allZone, forZone = false, true, false, true, false
	for _, e := range eps {
		if !e.Ready {
			continue
		}
		ready = true
		if len(e.NodeHints()) == 0 {
			allNode = false
		} else if slices.Contains(e.NodeHints(), node.Name) {
			forNode = true
		}
		if len(e.ZoneHints()) == 0 {
			allZone = false
		} else if slices.Contains(e.ZoneHints(), node.Zone()) {
			forZone = true
		}
	}
	switch {
	case !ready:
		return topologyNone
	case allNode && forNode:
		return topologySameNode
	case allZone && forZone:
		return topologySameZone
	}
	return topologyNone
}

// derivedHints returns eps with hints derived from spec.trafficDistribution
// when no ready endpoint has any, else eps unchanged. A folder of manifests
// has no EndpointSlice controller to write hints, so kp derives them as the
// controller would: each endpoint hinted for its own zone (PreferClose,
// PreferSameZone), and its own node too (PreferSameNode). Slices written by
// the controller already carry these hints, so this changes nothing there.
func derivedHints(sp *ServicePort, eps []Endpoint) []Endpoint {
	var byNode bool
	switch sp.TrafficDistribution {
	case v1.ServiceTrafficDistributionPreferClose, v1.ServiceTrafficDistributionPreferSameZone:
	case v1.ServiceTrafficDistributionPreferSameNode:
		byNode = true
	default:
		return eps
	}
	if slices.ContainsFunc(eps, func(e Endpoint) bool {
		return e.Ready && (len(e.ZoneHints()) > 0 || len(e.NodeHints()) > 0)
	}) {
		return eps
	}
	out := slices.Clone(eps)
	for i, e := range out {
		// PreferSameNode falls back to the zone: the controller hints both.
		var h EndpointHints
		if e.Hints != nil {
			h = *e.Hints // a copy: Hints are shared with the tracker's endpoints
		}
		if byNode && e.NodeName() != "" {
			h.ForNodes = []string{e.NodeName()}
		}
		if e.Zone() != "" {
			h.ForZones = []string{e.Zone()}
		}
		out[i].Hints = nil
		if h.ForNodes != nil || h.ForZones != nil {
			out[i].Hints = &h
		}
	}
	return out
}
