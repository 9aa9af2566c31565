package proxy

import (
	"fmt"
	"net/netip"
	"strings"
)

// Why an endpoint is, or is not, among a traffic policy's endpoints: the
// reasons kp explain prints, each from the rule of SelectEndpoints that
// decided it.
type EndpointReason string

const (
	// ReasonReady: ready, and nothing else excludes it.
	ReasonReady EndpointReason = "ready"
	// ReasonTerminatingFallback: serving and terminating, used because no
	// endpoint the policy may use is ready (a rolling update's last pods).
	ReasonTerminatingFallback EndpointReason = "serving-terminating-fallback"
	// ReasonTerminating: serving and terminating, unused because some
	// endpoint the policy may use is ready.
	ReasonTerminating EndpointReason = "terminating"
	// ReasonNotReady: neither ready nor serving and terminating.
	ReasonNotReady EndpointReason = "not-ready"
	// ReasonOtherZone: topology hints apply and name other zones.
	ReasonOtherZone EndpointReason = "other-zone-hint"
	// ReasonOtherNode: topology hints apply and name other nodes.
	ReasonOtherNode EndpointReason = "other-node-hint"
	// ReasonNotLocal: the Local policy takes this node's endpoints only.
	ReasonNotLocal EndpointReason = "not-on-this-node"
)

// EndpointChoice is one endpoint as one traffic policy sees it.
type EndpointChoice struct {
	Endpoint Endpoint
	// Chosen says the policy sends new connections to the endpoint: it is
	// in SelectEndpoints' list for the policy.
	Chosen bool
	Reason EndpointReason
	// Detail says the reason with the endpoint's facts ("hinted for
	// zone-b; this node is in zone-a").
	Detail string
}

// PolicyChoices is SelectEndpoints with its reasons, for one family's
// endpoints of one ServicePort: every endpoint, chosen or not, under each
// traffic policy the port uses.
type PolicyChoices struct {
	Selection EndpointSelection
	// Cluster and Local hold one choice per endpoint, in the order of eps;
	// nil when the port never uses that policy.
	Cluster, Local []EndpointChoice
	// Topology says how hints narrowed the Cluster policy: "" (not at
	// all), "zone" or "node", with TopologyDetail saying why they applied
	// or were ignored.
	Topology       string
	TopologyDetail string
}

// ExplainEndpoints is SelectEndpoints (which it calls: the choice is
// that one) with, for every endpoint, why each policy takes it or not.
// The reasons come from the same rules: the topology mode and the hints
// derived from trafficDistribution, the node of the endpoint, and the
// ready-else-terminating fallback.
func ExplainEndpoints(sp *ServicePort, eps []Endpoint, node Node) PolicyChoices {
	pc := PolicyChoices{Selection: SelectEndpoints(sp, eps, node)}
	if sp.UsesClusterEndpoints() {
		hinted := derivedHints(sp, eps)
		mode := topologyMode(hinted, node)
		pc.Topology, pc.TopologyDetail = topologyWhy(sp, eps, hinted, mode, node)
		pc.Cluster = choices(eps, pc.Selection.Cluster, func(i int) (EndpointReason, string) {
			if mode.allows(hinted[i], node) {
				return "", ""
			}
			if mode == topologySameNode {
				return ReasonOtherNode, fmt.Sprintf("hinted for node %s; this node is %s", list(hinted[i].NodeHints()), node.Name)
			}
			return ReasonOtherZone, fmt.Sprintf("hinted for zone %s; this node is in zone %q", list(hinted[i].ZoneHints()), node.Zone())
		})
	}
	if sp.UsesLocalEndpoints() {
		pc.Local = choices(eps, pc.Selection.Local, func(i int) (EndpointReason, string) {
			if eps[i].NodeName() == node.Name {
				return "", ""
			}
			on := eps[i].NodeName()
			if on == "" {
				on = "no node"
			}
			return ReasonNotLocal, fmt.Sprintf("on %s, not on this node (%s): traffic policy Local", on, node.Name)
		})
	}
	return pc
}

// choices gives each endpoint its reason: excluded by the policy's own
// rule (excluded returns a reason), else by its condition, with the
// terminating fallback decided, as readyOrTerminating does, among the
// endpoints the policy's rule keeps.
func choices(eps, chosen []Endpoint, excluded func(i int) (EndpointReason, string)) []EndpointChoice {
	in := map[netip.AddrPort]bool{}
	for _, c := range chosen {
		in[c.AddrPort()] = true
	}
	readyKept := false
	for i, e := range eps {
		if r, _ := excluded(i); r == "" && e.Ready {
			readyKept = true
		}
	}
	out := make([]EndpointChoice, len(eps))
	for i, e := range eps {
		c := EndpointChoice{Endpoint: e, Chosen: in[e.AddrPort()]}
		r, detail := excluded(i)
		switch {
		case r != "":
			c.Reason, c.Detail = r, detail
		case e.Ready:
			c.Reason, c.Detail = ReasonReady, "ready"
		case e.Serving && e.Terminating && !readyKept:
			c.Reason, c.Detail = ReasonTerminatingFallback, "serving and terminating: used because no endpoint is ready"
		case e.Serving && e.Terminating:
			c.Reason, c.Detail = ReasonTerminating, "serving and terminating: unused while ready endpoints exist"
		default:
			c.Reason, c.Detail = ReasonNotReady, notReadyDetail(e)
		}
		out[i] = c
	}
	return out
}

func notReadyDetail(e Endpoint) string {
	if e.Terminating {
		return "terminating and no longer serving"
	}
	return "not ready"
}

// topologyWhy says how topologyMode decided for the hints eps carry.
func topologyWhy(sp *ServicePort, eps, hinted []Endpoint, mode topology, node Node) (string, string) {
	// derivedHints returns eps itself unless it derived hints.
	derived := len(eps) > 0 && &hinted[0] != &eps[0]
	from := "the EndpointSlices' hints"
	if derived {
		from = "hints derived from trafficDistribution " + sp.TrafficDistribution
	}
	switch mode {
	case topologySameNode:
		return "node", fmt.Sprintf("%s: every ready endpoint has a node hint and one names this node (%s)", from, node.Name)
	case topologySameZone:
		return "zone", fmt.Sprintf("%s: every ready endpoint has a zone hint and one names this node's zone (%s)", from, node.Zone())
	}
	for _, e := range hinted {
		if e.Ready && (len(e.ZoneHints()) > 0 || len(e.NodeHints()) > 0) {
			return "", fmt.Sprintf("%s ignored: not every ready endpoint has one, or none names this node or its zone %q", from, node.Zone())
		}
	}
	return "", ""
}

func list(ss []string) string {
	if len(ss) == 0 {
		return "nothing"
	}
	return strings.Join(ss, ", ")
}
