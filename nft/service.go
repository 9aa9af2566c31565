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

// serviceChainBase names a service port in chain names:
// "namespace/name/protocol/port" (port name, or number when unnamed).
func serviceChainBase(sp *proxy.ServicePort) string {
	port := sp.Name.Port
	if port == "" {
		port = fmt.Sprint(sp.Port)
	}
	return fmt.Sprintf("%s/%s/%s/%s", sp.Name.Namespace, sp.Name.Name, strings.ToLower(string(sp.Protocol)), port)
}

func serviceChainName(sp *proxy.ServicePort) string  { return "svc-" + serviceChainBase(sp) }
func externalChainName(sp *proxy.ServicePort) string { return "ext-" + serviceChainBase(sp) }

// endpointChainName: nft's parser rejects ':' in chain names, so IPv6
// colons are spelled as dots.
func endpointChainName(sp *proxy.ServicePort, ep proxy.Endpoint) string {
	return fmt.Sprintf("ep-%s__%s/%d", serviceChainBase(sp), strings.ReplaceAll(ep.IP.String(), ":", "."), ep.Port)
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

// render builds every object that belongs to one service port in family f.
func (b *Backend) render(f family, sp *proxy.ServicePort, eps []proxy.Endpoint) *view {
	v := newView()
	clusterIPs := proxy.FilterAddrs(f.pf, sp.ClusterIPs)
	external := append(proxy.FilterAddrs(f.pf, sp.ExternalIPs), proxy.FilterAddrs(f.pf, sp.LoadBalancerIPs)...)
	if len(clusterIPs) == 0 {
		// A single-stack service of the other family has nothing here.
		return v
	}
	comment := sp.Name.String()
	proto := protoNumber(sp.Protocol)
	protoText := protoName(proto)

	var usable []proxy.Endpoint
	for _, e := range proxy.UsableEndpoints(eps) {
		if f.pf.Has(e.IP) {
			usable = append(usable, e)
		}
	}

	svcChain, extChain := serviceChainName(sp), externalChainName(sp)
	hasExternal := len(external) > 0 || sp.NodePort != 0
	target := func(set string, addr netip.Addr, goTo string) {
		e := Element{Key: pad4(addrProtoPortKey(addr, proto, sp.Port)),
			KeyText: keyText(addr.String(), protoText, fmt.Sprint(sp.Port)), Goto: goTo, Comment: comment}
		v.addElement(set, e)
	}
	nodePort := func(set string, goTo string) {
		k := pad4(binary.BigEndian.AppendUint16([]byte{proto, 0, 0, 0}, uint16(sp.NodePort)))
		v.addElement(set, Element{Key: k, KeyText: keyText(protoText, fmt.Sprint(sp.NodePort)), Goto: goTo, Comment: comment})
	}

	if len(usable) == 0 {
		for _, a := range clusterIPs {
			target(mapNoEndpointServices, a, chainReject)
		}
		for _, a := range external {
			target(mapNoEndpointServices, a, chainReject)
		}
		if sp.NodePort != 0 {
			nodePort(mapNoEndpointNodePorts, chainReject)
		}
		return v
	}

	// Service chain: masquerade decision, then a random endpoint.
	svc := &Chain{Name: svcChain}
	if b.cfg.MasqueradeAll {
		svc.Rules = append(svc.Rules, newRule(f).verdict(expr.VerdictJump, chainMarkMasq).build(comment))
	} else if len(proxy.FilterPrefixes(f.pf, b.cfg.ClusterCIDRs)) > 0 {
		// Reached from a ClusterIP (external traffic is marked in the
		// external chain): masquerade sources outside the cluster.
		svc.Rules = append(svc.Rules, newRule(f).addrInSet(true, true, setClusterCIDRs).verdict(expr.VerdictJump, chainMarkMasq).build(comment))
	}
	epChains := make([]string, len(usable))
	for i, e := range usable {
		name := endpointChainName(sp, e)
		epChains[i] = name
		v.chains[name] = &Chain{Name: name, Rules: []Rule{
			// Hairpin: a pod reaching itself through the service must see
			// the reply come back through the node.
			newRule(f).addrIs(true, false, e.IP).verdict(expr.VerdictJump, chainMarkMasq).build(comment),
			newRule(f).counterObj(name).dnat(proto, e.AddrPort()).build(comment),
		}}
		v.counters[name] = true
	}
	svc.Rules = append(svc.Rules, newRule(f).numgenVMap(epChains).build(comment))
	v.chains[svcChain] = svc
	for _, a := range clusterIPs {
		target(mapServiceIPs, a, svcChain)
	}

	if hasExternal {
		v.chains[extChain] = &Chain{Name: extChain, Rules: []Rule{
			// externalTrafficPolicy Cluster: the node may forward to an
			// endpoint anywhere, so replies must come back through it.
			newRule(f).verdict(expr.VerdictJump, chainMarkMasq).build(comment),
			newRule(f).verdict(expr.VerdictGoto, svcChain).build(comment),
		}}
		for _, a := range external {
			target(mapServiceIPs, a, extChain)
		}
		if sp.NodePort != 0 {
			nodePort(mapServiceNodePorts, extChain)
		}
	}
	return v
}
