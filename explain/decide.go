package explain

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/kpproxy/kp/conntrack"
	"github.com/kpproxy/kp/proxy"
)

// How a Service port's packet is decided, by the rules every mode follows
// (upstream kube-proxy's; the nftables mode's rules are the reference:
// nft/service.go, nft/local.go): the source-range firewall first, then the
// traffic policy, then that policy's endpoints, and masquerade.

var viaKind = map[conntrack.Via]string{
	conntrack.ViaClusterIP: KindClusterIP, conntrack.ViaNodePort: KindNodePort,
	conntrack.ViaExternalIP: KindExternalIP, conntrack.ViaLoadBalancerIP: KindLoadBalancerIP,
}

func explainServicePort(e *Explanation, m *Model, p Packet, sp *proxy.ServicePort, via conntrack.Via, o Options) {
	fam := proxy.FamilyOf(p.Dst.Addr())
	e.Service = &Service{Namespace: sp.Name.Namespace, Name: sp.Name.Name, PortName: sp.Name.Port,
		Protocol: string(sp.Protocol), Port: sp.Port, NodePort: sp.NodePort, Type: string(sp.Type)}
	e.Address = Address{Kind: viaKind[via], Detail: addressDetail(sp, via, p)}
	e.Source = classify(m, p, via)
	external := via != conntrack.ViaClusterIP
	pc := proxy.ExplainEndpoints(sp, proxy.FilterEndpoints(fam, m.State.Endpoints[sp.Name]), m.State.Node)

	if via == conntrack.ViaLoadBalancerIP && sourceRangeRefuses(e, sp, fam, p) {
		return
	}
	local, why := policyOf(sp, external, e.Source)
	e.Policy, e.PolicyWhy = "Cluster", why
	choices, eligible := pc.Cluster, pc.Selection.Cluster
	if local {
		e.Policy, choices, eligible = "Local", pc.Local, pc.Selection.Local
	} else if pc.Topology != "" || pc.TopologyDetail != "" {
		e.Topology = pc.TopologyDetail
	}
	for _, c := range choices {
		ep := c.Endpoint
		x := Endpoint{Address: ep.String(), Ready: ep.Ready, Serving: ep.Serving, Terminating: ep.Terminating,
			NodeName: ep.NodeName(), Zone: ep.Zone(), Eligible: c.Chosen, Reason: string(c.Reason), Detail: c.Detail}
		if c.Chosen {
			x.Probability = 1 / float64(len(eligible))
			x.Hairpin = p.Src.IsValid() && ep.IP == p.Src
		}
		e.Endpoints = append(e.Endpoints, x)
	}
	var pinned *Endpoint
	if sp.AffinityTimeout > 0 {
		pinned = explainAffinity(e, m, sp, p, o.Affinity)
	}
	switch {
	case pinned != nil:
		e.Verdict = VerdictDNAT
		e.Why = fmt.Sprintf("DNAT to %s: this client's ClientIP affinity entry pins it there%s (without it: one of %d endpoint(s) "+
			"of the %s policy at random, then kept)", pinned.Address, untilText(e.Affinity), len(eligible), e.Policy)
	case len(eligible) > 0:
		e.Verdict = VerdictDNAT
		e.Why = fmt.Sprintf("DNAT to one of %d endpoint(s) of the %s policy, each new connection picked at random", len(eligible), e.Policy)
	case !pc.Selection.Usable:
		e.Verdict, e.Reject = VerdictReject, rejectHow(p)
		e.Why = fmt.Sprintf("no endpoint: %s has no ready (or serving and terminating) endpoint of %s anywhere, so kp rejects (%s)",
			sp.Name, fam, e.Reject)
		return
	case m.Mode == string(proxy.ModeIPVS):
		// One virtual server per address, whose real servers are the
		// policy's endpoints: IPVS refuses a connection it has none for.
		e.Verdict, e.Reject = VerdictReject, "ICMP port unreachable"
		e.Why = fmt.Sprintf("the %s policy has no endpoint on this node (%s): the address's IPVS virtual server has no real "+
			"server, and IPVS refuses the connection (%s), as upstream's ipvs mode does", e.Policy, m.State.Node.Name, e.Reject)
		return
	default:
		e.Verdict = VerdictDrop
		e.Why = fmt.Sprintf("the %s policy has no endpoint on this node (%s): kp drops the packet, as upstream does, "+
			"though other nodes have endpoints", e.Policy, m.State.Node.Name)
		return
	}
	e.Masquerade = masquerade(m, sp, external, local, e.Source, fam)
	if slices.ContainsFunc(e.Endpoints, func(x Endpoint) bool { return x.Hairpin }) && e.Masquerade.Decision != "yes" {
		e.Masquerade = &Masquerade{Decision: "depends", Why: "masqueraded if the pick is the client itself (hairpin: its reply must " +
			"come back through the node); otherwise: " + e.Masquerade.Why}
	}
}

func addressDetail(sp *proxy.ServicePort, via conntrack.Via, p Packet) string {
	switch via {
	case conntrack.ViaNodePort:
		return fmt.Sprintf("NodePort %d of %s on node address %s", sp.NodePort, sp.Name, p.Dst.Addr())
	case conntrack.ViaClusterIP:
		return fmt.Sprintf("ClusterIP %s of %s, port %d", p.Dst.Addr(), sp.Name, sp.Port)
	}
	return fmt.Sprintf("%s %s of %s, port %d", viaKind[via], p.Dst.Addr(), sp.Name, sp.Port)
}

// classify tells what kind of client p comes from, as kp's rules do: the
// node itself by its local addresses, a pod by detect-local's CIDRs (or,
// in the interface modes, not from the address). Without --from, the
// usual client of the address kind is assumed.
func classify(m *Model, p Packet, via conntrack.Via) Source {
	yes, no := true, false
	if !p.Src.IsValid() {
		if via == conntrack.ViaClusterIP {
			return Source{Pod: &yes, Assumed: true, Why: "no --from: assumed a pod of this node (give --from for another client)"}
		}
		return Source{Pod: &no, Assumed: true, Why: "no --from: assumed a client outside the cluster (give --from for another client)"}
	}
	s := Source{Address: p.Src.String(), Node: slices.Contains(m.Facts.LocalAddrs, p.Src)}
	fam := proxy.FamilyOf(p.Src)
	switch cidrs := proxy.FilterPrefixes(fam, m.Facts.LocalCIDRs); {
	case m.Facts.LocalInterface != "":
		s.Why = "kp tells pods' traffic by the interface it arrives on (" + m.localInterface() + "), not by its address"
	case len(cidrs) == 0:
		s.Pod = &no
		s.Why = fmt.Sprintf("kp has no %s cluster CIDR, so it tells no traffic as a pod's", fam)
	case slices.ContainsFunc(cidrs, func(c netip.Prefix) bool { return c.Contains(p.Src) }):
		s.Pod = &yes
		s.Why = fmt.Sprintf("in %s: a pod's, by detect-local", prefixList(cidrs))
	default:
		s.Pod = &no
		s.Why = fmt.Sprintf("outside %s: not a pod's", prefixList(cidrs))
	}
	if s.Node {
		s.Why = "a local address of the node; " + s.Why
	}
	return s
}

func (m *Model) localInterface() string {
	if m.Facts.LocalInterfacePrefix {
		return m.Facts.LocalInterface + "*"
	}
	return m.Facts.LocalInterface
}

// sourceRangeRefuses applies loadBalancerSourceRanges, checked before DNAT
// on a connection's first packet; it reports whether the packet is
// dropped there.
func sourceRangeRefuses(e *Explanation, sp *proxy.ServicePort, fam proxy.Family, p Packet) bool {
	ranges := proxy.FilterPrefixes(fam, sp.LoadBalancerSourceRanges)
	if len(ranges) == 0 {
		return false
	}
	e.Firewall = &SourceRange{Ranges: strings.Split(prefixList(ranges), ", ")}
	if !p.Src.IsValid() {
		e.note("loadBalancerSourceRanges allow only %s: give --from to check a client", prefixList(ranges))
		return false
	}
	ok := slices.ContainsFunc(ranges, func(r netip.Prefix) bool { return r.Contains(p.Src) })
	e.Firewall.Allowed = &ok
	if ok {
		return false
	}
	e.Verdict = VerdictDrop
	e.Why = fmt.Sprintf("source range refused: %s is outside loadBalancerSourceRanges %s, so kp drops it before DNAT", p.Src, prefixList(ranges))
	return true
}

// policyOf decides which traffic policy the packet follows: ClusterIPs the
// internal policy; external addresses the external policy, except that
// with Local, pods and the node itself reach every endpoint, as upstream.
func policyOf(sp *proxy.ServicePort, external bool, src Source) (local bool, why string) {
	if !external {
		if sp.InternalPolicyLocal {
			return true, "a ClusterIP, internalTrafficPolicy Local: this node's endpoints only"
		}
		return false, "a ClusterIP, internalTrafficPolicy Cluster"
	}
	switch {
	case !sp.ExternalPolicyLocal:
		return false, "an external address, externalTrafficPolicy Cluster"
	case src.Node:
		return false, "externalTrafficPolicy Local, but from the node itself, which reaches every endpoint (masqueraded)"
	case src.Pod != nil && *src.Pod:
		return false, "externalTrafficPolicy Local, but from a pod, which reaches every endpoint as through the ClusterIP"
	case src.Pod == nil:
		return true, "externalTrafficPolicy Local: this node's endpoints only, unless the packet comes from a pod (by its interface), " +
			"which reaches every endpoint"
	}
	return true, "externalTrafficPolicy Local: this node's endpoints only, keeping the client's address"
}

// masquerade decides, for a packet that is DNATed, whether its source is
// rewritten: always with externalTrafficPolicy Cluster on an external
// address and from the node under Local; never for outside traffic under
// Local; otherwise the ClusterIP rule: masquerade-all, else what is not a
// pod's.
func masquerade(m *Model, sp *proxy.ServicePort, external, local bool, src Source, fam proxy.Family) *Masquerade {
	switch {
	case external && !sp.ExternalPolicyLocal:
		return &Masquerade{"yes", "externalTrafficPolicy Cluster: the endpoint may be on another node, whose reply must come back through this one"}
	case external && src.Node:
		return &Masquerade{"yes", "from the node itself to an external address"}
	case external && local:
		return &Masquerade{"no", "externalTrafficPolicy Local: the endpoint is on this node and sees the client's own address"}
	case m.Facts.MasqueradeAll:
		return &Masquerade{"yes", "--masquerade-all"}
	case m.Facts.LocalInterface != "":
		return &Masquerade{"depends", "yes unless the packet arrives on " + m.localInterface() + " (a pod's, by detect-local)"}
	case len(proxy.FilterPrefixes(fam, m.Facts.LocalCIDRs)) == 0:
		return &Masquerade{"no", fmt.Sprintf("kp has no %s cluster CIDR to tell pods' traffic by, so it masquerades none", fam)}
	case src.Pod != nil && *src.Pod:
		return &Masquerade{"no", "from a pod: the reply comes back through the pod network"}
	}
	return &Masquerade{"yes", "not from a pod: the reply must come back through this node"}
}

func prefixList(ps []netip.Prefix) string {
	ss := make([]string, len(ps))
	for i, p := range ps {
		ss[i] = p.String()
	}
	return strings.Join(ss, ", ")
}
