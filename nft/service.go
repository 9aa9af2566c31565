package nft

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables/expr"

	"github.com/kpproxy/kp/proxy"
)

// serviceChainBase names a service port in object names:
// "namespace/name/protocol/port" (port name, or number when unnamed).
// Kubernetes names cannot hold '/', so no two service ports share one.
func serviceChainBase(sp *proxy.ServicePort) string {
	port := sp.Name.Port
	if port == "" {
		port = fmt.Sprint(sp.Port)
	}
	return fmt.Sprintf("%s/%s/%s/%s", sp.Name.Namespace, sp.Name.Name, strings.ToLower(string(sp.Protocol)), port)
}

// Per service port: the chain of each traffic policy (svc- for Cluster,
// local- for Local), the chain of external traffic, and the source-range
// firewall (a chain and a set of the same name).
func serviceChainName(sp *proxy.ServicePort) string  { return "svc-" + serviceChainBase(sp) }
func localChainName(sp *proxy.ServicePort) string    { return "local-" + serviceChainBase(sp) }
func externalChainName(sp *proxy.ServicePort) string { return "ext-" + serviceChainBase(sp) }
func firewallName(sp *proxy.ServicePort) string      { return "firewall-" + serviceChainBase(sp) }

// pickChainName is the chain that picks the endpoint slot for the policy
// chain named policy.
func pickChainName(policy string) string { return "pick-" + policy }

// endpointID names one endpoint of a service port. nft's parser rejects ':'
// in names, so IPv6 colons are spelled as dots.
func endpointID(sp *proxy.ServicePort, ep proxy.Endpoint) string {
	return fmt.Sprintf("%s__%s/%d", serviceChainBase(sp), strings.ReplaceAll(ep.IP.String(), ":", "."), ep.Port)
}

// affinitySetName is the endpoint's session affinity set.
func affinitySetName(sp *proxy.ServicePort, ep proxy.Endpoint) string {
	return "affinity-" + endpointID(sp, ep)
}

func addrProtoPortKey(a netip.Addr, proto uint8, port int32) []byte {
	k := append([]byte{}, a.AsSlice()...)
	k = append(k, proto, 0, 0, 0)
	return binary.BigEndian.AppendUint16(k, uint16(port)) // padded to a 32-bit register below
}

func pad4(k []byte) []byte {
	for len(k)%4 != 0 {
		k = append(k, 0)
	}
	return k
}

// serviceRender builds the objects of one service port in one family.
type serviceRender struct {
	b       *Backend
	f       family
	sp      *proxy.ServicePort
	v       *objects
	comment string
	proto   uint8
	slots   *slotTable
	// picks are the policies' own pick chains, by name, written when
	// something goes to them; sharedSlots is the Cluster policy's
	// service-slots value when the shared chains pick its ClusterIPs.
	picks       [2]*Chain // a render has two policies at most
	sharedSlots uint32
}

// render builds every object that belongs to one service port in family f,
// following upstream kube-proxy's nftables mode: ClusterIPs lead to the
// internal policy's chain, external addresses and the NodePort to the
// external chain; a policy with no endpoint rejects (no usable endpoint
// anywhere) or drops (none for that policy) in the filter hooks.
func (b *Backend) render(f family, slots *slotTable, sp *proxy.ServicePort, eps []proxy.Endpoint, node proxy.Node) *objects {
	return b.renderInto(newObjects(), f, slots, sp, eps, node)
}

// renderInto is render into v, which it resets first (a full sync renders
// every Service into the same objects, their maps allocated once).
func (b *Backend) renderInto(v *objects, f family, slots *slotTable, sp *proxy.ServicePort, eps []proxy.Endpoint, node proxy.Node) *objects {
	v.reset()
	clusterIPs := proxy.FilterAddrs(f.pf, sp.ClusterIPs)
	if len(clusterIPs) == 0 {
		return v // a single-stack service of the other family
	}
	r := &serviceRender{b: b, f: f, sp: sp, v: v, comment: fitComment(sp.Name.String()), proto: proxy.ProtocolNumber(sp.Protocol), slots: slots}
	sel := proxy.SelectEndpoints(sp, proxy.FilterEndpoints(f.pf, eps), node)
	noEndpoint := Element{Verdict: verdictGoto, Chain: chainReject}
	if sel.Usable {
		noEndpoint = Element{Verdict: verdictDrop}
	}

	var cluster, local policyPath
	if len(sel.Cluster) > 0 {
		cluster = r.policyChain(serviceChainName(sp), sel.Cluster, nil, chainClusterDNAT, false)
	}
	if len(sel.Local) > 0 {
		var masq []Rule
		if sp.InternalPolicyLocal {
			// The local chain is the ClusterIPs' path too: masquerade
			// as for them, but not for external traffic, whose source
			// the Local policy keeps.
			masq = r.clusterMasquerade(clusterIPs)
		}
		// Only the ext- chain goes to the Local policy unless the
		// ClusterIPs do too: it can jump to the pick chain itself.
		local = r.policyChain(localChainName(sp), sel.Local, masq, chainEndpointDNAT, sp.InternalPolicyLocal)
	}

	internal := cluster
	if sp.InternalPolicyLocal {
		internal = local
	}
	for _, a := range clusterIPs {
		// The ClusterIP's element is every port's: named after the
		// Service, not the port that wrote it first (which may go while
		// the others stay, and the element with them).
		v.addElement(setClusterIPs, Element{Key: addrKey(a), KeyText: a.String(), Comment: fitComment(sp.Name.Namespace + "/" + sp.Name.Name)})
		r.target(a, internal, noEndpoint)
	}
	if sp.HasExternal() {
		r.external(cluster, local, noEndpoint)
	}
	return v
}

// addrElement is the "address . protocol . port" element of a service
// address, without a verdict.
func (r *serviceRender) addrElement(a netip.Addr) Element {
	return Element{Key: pad4(addrProtoPortKey(a, r.proto, r.sp.Port)),
		KeyText: keyText(a.String(), protoName(r.proto), fmt.Sprint(r.sp.Port)), Comment: r.comment}
}

// target maps one service address to p, or to noEndpoint when p is none
// (no endpoint for this traffic). A pick path's address is also put in
// cluster-picked, whose static rule in the services chain goes on to
// cluster-dnat after the jump returns. Only the Cluster policy's ClusterIP
// path is a pick here: the Local policy has a chain of its own when
// ClusterIPs go to it, and external addresses go to the ext- chain.
func (r *serviceRender) target(a netip.Addr, p policyPath, noEndpoint Element) {
	e := r.addrElement(a)
	if p.pick {
		if p.shared {
			// Data only: the count and the base (see sharedPicks).
			e.Data, e.DataText = slotKey(r.sharedSlots), fmt.Sprintf("0x%08x", r.sharedSlots)
			r.v.addElement(mapServiceSlots, e)
			return
		}
		r.v.addElement(setClusterPicked, e)
		e.Verdict, e.Chain = verdictJump, p.chain
		r.ownPick(p)
		r.v.addElement(mapServiceIPs, e)
		return
	}
	r.route(e, p.chain, noEndpoint, mapServiceIPs, mapNoEndpointServices)
}

func (r *serviceRender) nodePort(chain string, noEndpoint Element) {
	k := pad4(binary.BigEndian.AppendUint16([]byte{r.proto, 0, 0, 0}, uint16(r.sp.NodePort)))
	e := Element{Key: k, KeyText: keyText(protoName(r.proto), fmt.Sprint(r.sp.NodePort)), Comment: r.comment}
	r.route(e, chain, noEndpoint, mapServiceNodePorts, mapNoEndpointNodePorts)
}

// route adds e to serviceMap with "goto chain", or to noEndpointMap with
// noEndpoint's verdict when there is no chain.
func (r *serviceRender) route(e Element, chain string, noEndpoint Element, serviceMap, noEndpointMap string) {
	if chain == "" {
		e.Verdict, e.Chain = noEndpoint.Verdict, noEndpoint.Chain
		r.v.addElement(noEndpointMap, e)
		return
	}
	e.Verdict, e.Chain = verdictGoto, chain
	r.v.addElement(serviceMap, e)
}

// clusterMasquerade is the masquerade decision for the Service's traffic
// to its ClusterIPs only (the local chain of internalTrafficPolicy Local,
// which external traffic goes through too); the Cluster policy's, for all
// its traffic, is in the static cluster-dnat chain.
func (r *serviceRender) clusterMasquerade(only []netip.Addr) []Rule {
	var rules []Rule
	for _, a := range only {
		rules = append(rules, r.b.clusterMasquerade(r.f, a, r.comment)...)
	}
	return rules
}

// hairpinElement is "a . a": a pod at a that reached itself through a
// service must see the reply come back through the node.
func hairpinElement(a netip.Addr) Element {
	return Element{Key: append(a.AsSlice(), a.AsSlice()...), KeyText: keyText(a.String(), a.String())}
}

// external writes what external traffic (NodePort, externalIPs,
// LoadBalancer IPs) needs: its chain, its map entries, and the
// loadBalancerSourceRanges firewall.
func (r *serviceRender) external(cluster, local policyPath, noEndpoint Element) {
	sp, f := r.sp, r.f
	name := externalChainName(sp)
	var rules []Rule
	hasEndpoints := !cluster.none()
	always := func() *ruleBuilder { return newRule(f) }
	fromNode := func() *ruleBuilder { return newRule(f).fibSaddrLocal() }
	if !sp.ExternalPolicyLocal {
		if !cluster.none() {
			// The node may forward anywhere: replies must come back
			// through it. (Marked here, so past a pick the
			// Cluster policy's own decision has nothing to add.)
			rules = append([]Rule{newRule(f).verdict(expr.VerdictJump, chainMarkMasq).build(r.comment)},
				r.rules(cluster, always, chainEndpointDNAT)...)
		}
	} else {
		hasEndpoints = !local.none()
		if !cluster.none() {
			// As upstream: pods, and the node itself, reach every
			// endpoint through the external addresses too; only
			// traffic from outside keeps to this node's endpoints.
			if r.b.matchLocal(newRule(f), f, false) {
				fromPods := func() *ruleBuilder {
					rb := newRule(f)
					r.b.matchLocal(rb, f, false)
					return rb
				}
				rules = append(rules, r.rules(cluster, fromPods, "")...)
			}
			rules = append(rules, fromNode().verdict(expr.VerdictJump, chainMarkMasq).build(r.comment))
			rules = append(rules, r.rules(cluster, fromNode, chainEndpointDNAT)...)
		}
		if !local.none() {
			rules = append(rules, r.rules(local, always, "")...)
		}
	}
	chain := ""
	if len(rules) > 0 {
		chain = name
		r.v.chains[name] = &Chain{Name: name, Rules: rules}
	}

	lbIPs := proxy.FilterAddrs(f.pf, sp.LoadBalancerIPs)
	for _, a := range append(proxy.FilterAddrs(f.pf, sp.ExternalIPs), lbIPs...) {
		r.external1(a, chain, hasEndpoints, noEndpoint)
	}
	if sp.NodePort != 0 {
		if chain != "" {
			r.nodePort(chain, noEndpoint)
		}
		if !hasEndpoints {
			r.nodePort("", noEndpoint)
		}
	}
	if ranges := proxy.FilterPrefixes(f.pf, sp.LoadBalancerSourceRanges); len(ranges) > 0 && len(lbIPs) > 0 {
		r.firewall(lbIPs, ranges)
	}
}

// external1 maps one external address: to the external chain when there is
// one, and to noEndpoint when the external policy has no endpoint (with
// Local, pods still pass through the chain: DNAT then takes them out of the
// filter's no-endpoint check).
func (r *serviceRender) external1(a netip.Addr, chain string, hasEndpoints bool, noEndpoint Element) {
	if chain != "" {
		r.target(a, policyPath{chain: chain}, noEndpoint)
	}
	if !hasEndpoints {
		r.target(a, policyPath{}, noEndpoint)
	}
}

// firewall drops traffic to the LoadBalancer IPs from outside the source
// ranges, before DNAT.
func (r *serviceRender) firewall(lbIPs []netip.Addr, ranges []netip.Prefix) {
	name := firewallName(r.sp)
	r.v.sets[name] = &Set{Name: name, KeyType: r.f.addrType(), Interval: true,
		Comment: fitComment("loadBalancerSourceRanges of " + r.sp.Name.String())}
	r.v.elements[name] = map[string]Element{}
	for _, e := range prefixElements(ranges) {
		r.v.addElement(name, e)
	}
	r.v.chains[name] = &Chain{Name: name, Rules: []Rule{
		newRule(r.f).addrInSet(true, true, name).verdict(expr.VerdictDrop, "").build(r.comment),
	}}
	for _, a := range lbIPs {
		e := r.addrElement(a)
		e.Verdict, e.Chain = verdictGoto, name
		r.v.addElement(mapFirewallIPs, e)
	}
}
