package nft

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables/expr"
	v1 "k8s.io/api/core/v1"

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

func protoNumber(p v1.Protocol) uint8 {
	switch p {
	case v1.ProtocolUDP:
		return 17
	case v1.ProtocolSCTP:
		return 132
	}
	return 6
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
	v       *view
	comment string
	proto   uint8
	slots   *slotTable
}

// render builds every object that belongs to one service port in family f,
// following upstream kube-proxy's nftables mode: ClusterIPs lead to the
// internal policy's chain, external addresses and the NodePort to the
// external chain; a policy with no endpoint rejects (no usable endpoint
// anywhere) or drops (none for that policy) in the filter hooks.
func (b *Backend) render(f family, slots *slotTable, sp *proxy.ServicePort, eps []proxy.Endpoint, node proxy.Node) *view {
	v := newView()
	clusterIPs := proxy.FilterAddrs(f.pf, sp.ClusterIPs)
	if len(clusterIPs) == 0 {
		return v // a single-stack service of the other family
	}
	r := &serviceRender{b: b, f: f, sp: sp, v: v, comment: fitComment(sp.Name.String()), proto: protoNumber(sp.Protocol), slots: slots}
	sel := proxy.SelectEndpoints(sp, proxy.FilterEndpoints(f.pf, eps), node)
	noEndpoint := Element{Goto: chainReject}
	if sel.Usable {
		noEndpoint = Element{Drop: true}
	}

	var clusterChain, localChain string
	if len(sel.Cluster) > 0 {
		clusterChain = r.policyChain(serviceChainName(sp), sel.Cluster, nil, chainClusterDNAT)
	}
	if len(sel.Local) > 0 {
		var masq []Rule
		if sp.InternalPolicyLocal {
			// The local chain is the ClusterIPs' path too: masquerade
			// as for them, but not for external traffic, whose source
			// the Local policy keeps.
			masq = r.clusterMasquerade(clusterIPs)
		}
		localChain = r.policyChain(localChainName(sp), sel.Local, masq, chainEndpointDNAT)
	}

	internal := clusterChain
	if sp.InternalPolicyLocal {
		internal = localChain
	}
	for _, a := range clusterIPs {
		v.addElement(setClusterIPs, Element{Key: addrKey(a), KeyText: a.String(), Comment: r.comment})
		r.target(a, internal, noEndpoint)
	}
	if sp.HasExternal() {
		r.external(clusterChain, localChain, noEndpoint)
	}
	return v
}

// addrElement is the "address . protocol . port" element of a service
// address, without a verdict.
func (r *serviceRender) addrElement(a netip.Addr) Element {
	return Element{Key: pad4(addrProtoPortKey(a, r.proto, r.sp.Port)),
		KeyText: keyText(a.String(), protoName(r.proto), fmt.Sprint(r.sp.Port)), Comment: r.comment}
}

// target maps one service address to chain, or to noEndpoint when there is
// no chain (no endpoint for this traffic).
func (r *serviceRender) target(a netip.Addr, chain string, noEndpoint Element) {
	r.route(r.addrElement(a), chain, noEndpoint, mapServiceIPs, mapNoEndpointServices)
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
		e.Goto, e.Drop = noEndpoint.Goto, noEndpoint.Drop
		r.v.addElement(noEndpointMap, e)
		return
	}
	e.Goto = chain
	r.v.addElement(serviceMap, e)
}

// clusterMasquerade is the masquerade decision for the Service's traffic
// to its ClusterIPs only (the local chain of internalTrafficPolicy Local,
// which external traffic goes through too); the Cluster policy's, for all
// its traffic, is in the static cluster-dnat chain.
func (r *serviceRender) clusterMasquerade(only []netip.Addr) []Rule {
	var rules []Rule
	for _, a := range only {
		rules = append(rules, r.b.clusterMasquerade(r.f, proxy.FilterPrefixes(r.f.pf, r.b.cfg.ClusterCIDRs), a, r.comment)...)
	}
	return rules
}

// clusterMasquerade is the masquerade decision for traffic to a ClusterIP
// (to dst only, when valid): all of it with --masquerade-all, else what
// comes from outside the cluster CIDRs (so replies come back through this
// node); none without cluster CIDRs.
func (b *Backend) clusterMasquerade(f family, clusterCIDRs []netip.Prefix, dst netip.Addr, comment string) []Rule {
	rb := newRule(f)
	if dst.IsValid() {
		rb.addrIs(false, false, dst)
	}
	switch {
	case b.cfg.MasqueradeAll:
	case len(clusterCIDRs) > 0:
		rb.addrInSet(true, true, setClusterCIDRs)
	default:
		return nil
	}
	return []Rule{rb.verdict(expr.VerdictJump, chainMarkMasq).build(comment)}
}

// policyChain writes the chain of one traffic policy over eps: it picks a
// slot of the chain's block at random and goes to the static DNAT chain
// (see slots.go). kp does not use upstream's anonymous "numgen vmap" per
// Service, nor a map bound by a rule per Service: the kernel walks every
// set of the table for each set it creates and every binding of a map for
// each element it inserts, so either makes a full sync O(N²) in the number
// of Services (see README, "Why endpoints are slots").
//
// The chain goes on to dnat: cluster-dnat (the Cluster policy's masquerade
// decision, then endpoint-dnat) or endpoint-dnat itself. With session
// affinity the chain DNATs on its own, after first; the Cluster policy's
// masquerade decision is then its first rule.
func (r *serviceRender) policyChain(name string, eps []proxy.Endpoint, first []Rule, dnat string) string {
	if r.sp.AffinityTimeout > 0 {
		if dnat == chainClusterDNAT {
			first = r.b.clusterMasquerade(r.f, proxy.FilterPrefixes(r.f.pf, r.b.cfg.ClusterCIDRs), netip.Addr{}, r.comment)
		}
		return r.affinityChain(name, eps, first)
	}
	addrs := make([]netip.AddrPort, len(eps))
	byAddr := make(map[netip.AddrPort]proxy.Endpoint, len(eps))
	for i, e := range eps {
		addrs[i] = e.AddrPort()
		byAddr[addrs[i]] = e
	}
	blk := r.slots.assign(name, addrs)
	for i, a := range blk.eps {
		r.endpointObjects(byAddr[a])
		r.v.addElement(mapEndpoints, r.slotElement(blk.base+uint32(i), a))
	}
	// The choice of slot has a chain of its own, holding one rule with
	// no lookup, jump or NAT: when the number of endpoints or the block
	// changes, only that chain is rewritten, and the kernel does not
	// validate the whole table for it (it does for any rule added with a
	// lookup, a jump or goto, a meta set or a NAT expression: 20–60 ms at
	// 10,000 Services, against ~1 ms; see README).
	pick := pickChainName(name)
	r.v.chains[pick] = &Chain{Name: pick, Rules: []Rule{
		newRule(r.f).ctMarkSetSlot(uint32(len(blk.eps)), blk.base).build(r.comment)}}
	r.v.chains[name] = &Chain{Name: name, Rules: append(first,
		newRule(r.f).verdict(expr.VerdictJump, pick).build(r.comment),
		newRule(r.f).verdict(expr.VerdictGoto, dnat).build(r.comment))}
	return name
}

// slotElement is "slot : address . port" in the endpoints map, named after
// its Service port (the element's counter is the endpoint's count of new
// connections).
func (r *serviceRender) slotElement(slot uint32, a netip.AddrPort) Element {
	return Element{Key: slotKey(slot), KeyText: fmt.Sprintf("0x%08x", slot),
		Data: slotData(a), DataText: keyText(a.Addr().String(), fmt.Sprint(a.Port())), Comment: r.comment}
}

// affinityChain is a ClientIP-affinity chain, which keeps a rule per
// endpoint (only these Services pay for it): each endpoint has its
// dynamic set of clients, and the rule that picks an endpoint must also add
// the client to that endpoint's set. The client's last endpoint first,
// while its entry lives; else the i-th of n is taken with probability
// 1/(n-i) when reached ("numgen random mod n-i 0"), which is uniform over
// all n, and the last takes what is left.
func (r *serviceRender) affinityChain(name string, eps []proxy.Endpoint, first []Rule) string {
	c := &Chain{Name: name, Rules: first}
	for _, e := range eps {
		c.Rules = append(c.Rules, r.toEndpoint(newRule(r.f).addrInSet(true, false, affinitySetName(r.sp, e)), e))
	}
	for i, e := range eps {
		rb := newRule(r.f)
		if left := len(eps) - i; left > 1 {
			rb.numgenIs(uint32(left), 0)
		}
		c.Rules = append(c.Rules, r.toEndpoint(rb, e))
	}
	r.v.chains[name] = c
	return name
}

// toEndpoint ends rb with sending the connection to e: the client's
// affinity entry refreshed, a count of new connections (the rule's own
// counter: NAT chains see a connection's first packet only), DNAT.
func (r *serviceRender) toEndpoint(rb *ruleBuilder, e proxy.Endpoint) Rule {
	r.endpointObjects(e)
	if r.sp.AffinityTimeout > 0 {
		rb.updateSet(true, affinitySetName(r.sp, e))
	}
	return rb.counter().dnat(r.proto, e.AddrPort()).build(r.comment)
}

// endpointObjects declares e's affinity set (shared by both policies'
// chains), and records its pod for the hairpin set.
func (r *serviceRender) endpointObjects(e proxy.Endpoint) {
	if r.sp.AffinityTimeout > 0 {
		set := affinitySetName(r.sp, e)
		r.v.sets[set] = &Set{Name: set, KeyType: r.f.addrType(), Dynamic: true, Timeout: r.sp.AffinityTimeout,
			Comment: fitComment("session affinity of " + r.sp.Name.String())}
	}
	r.v.pods = append(r.v.pods, e.IP)
}

// hairpinElement is "a . a": a pod at a that reached itself through a
// service must see the reply come back through the node.
func hairpinElement(a netip.Addr) Element {
	return Element{Key: append(a.AsSlice(), a.AsSlice()...), KeyText: keyText(a.String(), a.String())}
}

// external writes what external traffic (NodePort, externalIPs,
// LoadBalancer IPs) needs: its chain, its map entries, and the
// loadBalancerSourceRanges firewall.
func (r *serviceRender) external(clusterChain, localChain string, noEndpoint Element) {
	sp, f := r.sp, r.f
	name := externalChainName(sp)
	var rules []Rule
	hasEndpoints := clusterChain != ""
	if !sp.ExternalPolicyLocal {
		if clusterChain != "" {
			// The node may forward anywhere: replies must come back
			// through it.
			rules = []Rule{
				newRule(f).verdict(expr.VerdictJump, chainMarkMasq).build(r.comment),
				newRule(f).verdict(expr.VerdictGoto, clusterChain).build(r.comment),
			}
		}
	} else {
		hasEndpoints = localChain != ""
		if clusterChain != "" {
			// As upstream: pods, and the node itself, reach every
			// endpoint through the external addresses too; only
			// traffic from outside keeps to this node's endpoints.
			if len(proxy.FilterPrefixes(f.pf, r.b.cfg.ClusterCIDRs)) > 0 {
				rules = append(rules, newRule(f).addrInSet(true, false, setClusterCIDRs).
					verdict(expr.VerdictGoto, clusterChain).build(r.comment))
			}
			rules = append(rules,
				newRule(f).fibSaddrLocal().verdict(expr.VerdictJump, chainMarkMasq).build(r.comment),
				newRule(f).fibSaddrLocal().verdict(expr.VerdictGoto, clusterChain).build(r.comment))
		}
		if localChain != "" {
			rules = append(rules, newRule(f).verdict(expr.VerdictGoto, localChain).build(r.comment))
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
		r.target(a, chain, noEndpoint)
	}
	if !hasEndpoints {
		r.target(a, "", noEndpoint)
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
		e.Goto = name
		r.v.addElement(mapFirewallIPs, e)
	}
}
