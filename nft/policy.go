package nft

import (
	"fmt"
	"net/netip"

	"github.com/google/nftables/expr"

	"github.com/kpproxy/kp/proxy"
)

// How a traffic policy's traffic reaches its endpoints: a pick of an
// endpoint slot (the policy's own pick chain, or the shared chains for a
// ClusterIP), or a chain of the policy's own with session affinity.

// policyPath is how traffic reaches a traffic policy's endpoints: "goto
// chain" (a policy chain of its own: with session affinity, or the Local
// policy's of ClusterIPs), or, where a policy chain would only pick the
// endpoint slot and go to the DNAT, "jump chain" to the pick chain itself
// and then "goto dnat". The zero path is a policy without endpoints.
type policyPath struct {
	chain string
	pick  bool
	dnat  string
	// shared says the policy's ClusterIPs are picked by the shared chains
	// (see sharedPicks), its block being small enough; chain is then the
	// policy's own pick chain, which external traffic goes through and
	// which is written only when something goes to it (ownPick).
	shared bool
}

func (p policyPath) none() bool { return p.chain == "" }

// rules sends what cond matches (nil: every packet) along p, going to
// dnat rather than p's own after a pick (the external chain has decided
// the masquerade already). cond is called once per rule.
func (r *serviceRender) rules(p policyPath, cond func() *ruleBuilder, dnat string) []Rule {
	if cond == nil {
		cond = func() *ruleBuilder { return newRule(r.f) }
	}
	if !p.pick {
		return []Rule{cond().verdict(expr.VerdictGoto, p.chain).build(r.comment)}
	}
	if dnat == "" {
		dnat = p.dnat
	}
	r.ownPick(p)
	return []Rule{
		cond().verdict(expr.VerdictJump, p.chain).build(r.comment),
		cond().verdict(expr.VerdictGoto, dnat).build(r.comment),
	}
}

// ownPick writes p's own pick chain.
func (r *serviceRender) ownPick(p policyPath) {
	for _, c := range r.picks {
		if c != nil && c.Name == p.chain {
			r.v.chains[p.chain] = c
		}
	}
}

// policyChain writes what one traffic policy over eps needs and returns
// the path to it: a chain that picks a slot of the policy's block at
// random, for the static DNAT chain (see slots.go). kp does not use
// upstream's anonymous "numgen vmap" per Service, nor a map bound by a rule
// per Service: the kernel walks every set of the table for each set it
// creates and every binding of a map for each element it inserts, so
// either makes a full sync O(N²) in the number of Services (see docs/modes.md,
// "Why endpoints are slots").
//
// After the pick, traffic goes on to dnat: cluster-dnat (the Cluster
// policy's masquerade decision, then endpoint-dnat) or endpoint-dnat
// itself. The policy has a chain of its own (name) only with first rules
// or when own asks for it: it jumps to the pick chain and goes to dnat;
// otherwise whoever sends traffic to the policy does that itself (see
// policyPath), which spares the kernel a chain and two jump rules per
// Service. With session affinity the policy's chain DNATs on its own,
// after first; the Cluster policy's masquerade decision is then its first
// rule.
func (r *serviceRender) policyChain(name string, eps []proxy.Endpoint, first []Rule, dnat string, own bool) policyPath {
	if r.sp.AffinityTimeout > 0 {
		if dnat == chainClusterDNAT {
			first = r.b.clusterMasquerade(r.f, netip.Addr{}, r.comment)
		}
		return policyPath{chain: r.affinityChain(name, eps, first)}
	}
	addrs := make([]netip.AddrPort, len(eps))
	for i, e := range eps {
		addrs[i] = e.AddrPort()
	}
	// The slot table knows the block by the name of the policy's pick
	// chain. Up to maxSharedPick endpoints, the shared pick-n chain
	// picks from it (see sharedPicks): the policy has no chain, and an
	// endpoint change that keeps the count changes data elements only.
	pick := pickChainName(name)
	blk := r.slots.assign(pick, addrs)
	r.v.blocks = append(r.v.blocks, pick)
	for i, a := range blk.eps.all() {
		r.pod(a.Addr()) // without affinity, all endpointObjects would do
		r.v.addElement(mapEndpoints, r.slotElement(blk.base+uint32(i), a))
	}
	// The policy's own pick chain holds one rule with no lookup, jump or
	// NAT: when the number of endpoints or the block changes, only that
	// chain is rewritten, and the kernel does not validate the whole
	// table for it (see docs/modes.md).
	c := &Chain{Name: pick, Rules: []Rule{newRule(r.f).ctMarkSetSlot(uint32(blk.eps.len()), blk.base).build(r.comment)}}
	if r.picks[0] == nil {
		r.picks[0] = c
	} else {
		r.picks[1] = c
	}
	p := policyPath{chain: pick, pick: true, dnat: dnat}
	if n := blk.eps.len(); n <= maxSharedPick && dnat == chainClusterDNAT && blk.base+blk.size-1 <= maxSharedSlot {
		p.shared, r.sharedSlots = true, uint32(n)<<countShift|blk.base
	}
	if len(first) == 0 && !own {
		return p
	}
	r.v.chains[name] = &Chain{Name: name, Rules: append(first, r.rules(p, nil, "")...)}
	return policyPath{chain: name}
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
	r.pod(e.IP)
}

// pod records an endpoint's pod for the hairpin set.
func (r *serviceRender) pod(a netip.Addr) { r.v.pods = append(r.v.pods, a) }
