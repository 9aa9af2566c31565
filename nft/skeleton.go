package nft

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// Names of kp's static objects. Per-service data lives in the maps; the
// chains below never change with the set of Services.
const (
	mapServiceIPs          = "service-ips"
	mapServiceNodePorts    = "service-nodeports"
	mapNoEndpointServices  = "no-endpoint-services"
	mapNoEndpointNodePorts = "no-endpoint-nodeports"
	mapFirewallIPs         = "firewall-ips"
	setNodePortIPs         = "nodeport-ips"
	setClusterCIDRs        = "cluster-cidrs"
	setClusterIPs          = "cluster-ips"
	setServiceCIDRs        = "service-cidrs"
	setHairpin             = "hairpin"
	mapEndpoints           = "endpoints"
	setClusterPicked       = "cluster-picked"
	mapServiceSlots        = "service-slots"
	mapCountPick           = "count-pick"
	mapSlotPick            = "slot-pick"

	chainServices        = "services"
	chainEndpointsCheck  = "service-endpoints-check"
	chainClusterIPsCheck = "cluster-ips-check"
	chainFirewallCheck   = "firewall-check"
	chainMarkMasq        = "mark-for-masquerade"
	chainMasquerading    = "masquerading"
	chainReject          = "reject-chain"
	chainEndpointDNAT    = "endpoint-dnat"
	chainClusterDNAT     = "cluster-dnat"
)

// staticSets declares kp's named sets and maps for family f.
func staticSets(f family) []*Set {
	addrProtoPort := nftables.MustConcatSetType(f.addrType(), nftables.TypeInetProto, nftables.TypeInetService)
	protoPort := nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService)
	return []*Set{
		{Name: mapServiceIPs, KeyType: addrProtoPort, Concat: true, VMap: true,
			Comment: "ClusterIP, external IP and LoadBalancer IP of each service port"},
		{Name: mapServiceNodePorts, KeyType: protoPort, Concat: true, VMap: true,
			Comment: "NodePort of each service port"},
		{Name: setClusterPicked, KeyType: addrProtoPort, Concat: true,
			Comment: "ClusterIPs whose service-ips verdict only picks an endpoint slot: then to cluster-dnat"},
		{Name: mapServiceSlots, KeyType: addrProtoPort, Concat: true, DataType: nftables.TypeMark, DataHostOrder: true,
			Comment: "ClusterIPs picked by the shared chains -> their endpoint count << 24 | the base of their slots"},
		{Name: mapCountPick, KeyType: nftables.TypeMark, KeyHostOrder: true, VMap: true,
			Comment: "an endpoint count << 24 (in the ct mark) -> the chain that picks one of that many slots"},
		{Name: mapSlotPick, KeyType: nftables.TypeMark, KeyHostOrder: true, VMap: true,
			Comment: "a shared pick's random k (in the ct mark) -> slot-k: the slots' base, k in its low bits"},
		{Name: mapNoEndpointServices, KeyType: addrProtoPort, Concat: true, VMap: true,
			Comment: "service addresses without endpoints: reject (none anywhere) or drop (none for the traffic policy)"},
		{Name: mapNoEndpointNodePorts, KeyType: protoPort, Concat: true, VMap: true,
			Comment: "NodePorts without endpoints: reject (none anywhere) or drop (none for the traffic policy)"},
		{Name: mapFirewallIPs, KeyType: addrProtoPort, Concat: true, VMap: true,
			Comment: "LoadBalancer IPs with loadBalancerSourceRanges"},
		{Name: setClusterIPs, KeyType: f.addrType(), Comment: "ClusterIPs: other ports are rejected"},
		{Name: setServiceCIDRs, KeyType: f.addrType(), Interval: true,
			Comment: "service CIDRs: unallocated addresses are dropped"},
		{Name: setNodePortIPs, KeyType: f.addrType(), Comment: "node addresses NodePorts answer on"},
		// Named for the default mode; with --detect-local-mode NodeCIDR
		// it holds the node's pod CIDRs, in the interface modes nothing.
		{Name: setClusterCIDRs, KeyType: f.addrType(), Interval: true, Comment: "--cluster-cidr"},
		{Name: mapEndpoints, KeyType: nftables.TypeMark,
			DataType: nftables.MustConcatSetType(f.addrType(), nftables.TypeInetService), Counter: true, KeyHostOrder: true,
			Comment: "endpoint slot (a connection's ct mark) -> endpoint; counts new connections"},
		{Name: setHairpin, KeyType: nftables.MustConcatSetType(f.addrType(), f.addrType()), Concat: true,
			Comment: "endpoint . endpoint: a pod that reached itself through a service is masqueraded"},
	}
}

func setByName(f family, name string) *Set {
	for _, s := range staticSets(f) {
		if s.Name == name {
			return s
		}
	}
	return &Set{Name: name}
}

func baseChain(name string, t nftables.ChainType, hook *nftables.ChainHook, hookName string, prio int32, rules ...Rule) *Chain {
	return &Chain{Name: name, Hook: &Hook{Type: t, Hook: hook, HookName: hookName, Priority: prio}, Rules: rules}
}

// skeleton returns the static chains and sets, and the small static sets'
// elements: what every sync desires whatever the Services.
func (b *Backend) skeleton(f family, nodePortIPs []netip.Addr, clusterCIDRs, serviceCIDRs []netip.Prefix) *objects {
	v := newObjects()
	for _, c := range slices.Concat(hookedChains(f), b.staticChains(f)) {
		v.chains[c.Name] = c
	}
	for _, s := range staticSets(f) {
		v.sets[s.Name] = s
		v.elements[s.Name] = map[string]Element{}
	}
	for _, a := range nodePortIPs {
		e := Element{Key: addrKey(a), KeyText: a.String()}
		v.elements[setNodePortIPs][keyID(e.Key, false)] = e
	}
	for _, e := range prefixElements(clusterCIDRs) {
		v.elements[setClusterCIDRs][keyID(e.Key, e.KeyEnd)] = e
	}
	for _, e := range prefixElements(serviceCIDRs) {
		v.elements[setServiceCIDRs][keyID(e.Key, e.KeyEnd)] = e
	}
	shared := sharedPicks[f]()
	for _, c := range shared.chains {
		v.chains[c.Name] = c
	}
	for set, es := range shared.elements {
		for k, e := range es {
			v.elements[set][k] = e
		}
	}
	return v
}

// maxSharedPick is the largest endpoint count the shared pick chains
// serve; a policy with more endpoints has a pick chain of its own. A
// shared pick keeps the count in the mark's top byte, and so the slots
// below it.
const (
	maxSharedPick = 64
	countShift    = 24
	maxSharedSlot = 1<<countShift - 1
)

const chainSharedPick = "shared-pick"

// sharedPickChain is the shared chain that picks one of n slots (n >= 2).
func sharedPickChain(n int) string { return fmt.Sprintf("pick-%d", n) }

func slotChain(k int) string { return fmt.Sprintf("slot-%d", k) }

// sharedPicks are the chains that pick an endpoint slot for the ClusterIPs
// of every Cluster policy of up to maxSharedPick endpoints (without session
// affinity), and their maps' elements. The services chain puts the
// ClusterIP's service-slots value in the connection's mark (its endpoint
// count n in the top byte, the base of its slots below) and goes to
// shared-pick, which goes through count-pick to pick-n; pick-n puts a random
// k below n in the mark ("ct mark set numgen random mod n") and goes to
// slot-k through slot-pick (maps keyed by the mark: nft types numgen as a
// plain integer, which a named map cannot be keyed by and still list as nft
// reloads it); slot-k looks the ClusterIP's value up again, keeps its base
// and sets its low bits to k, and goes on to cluster-dnat.
//
// With them such a Service has no chain and no verdict of its own: its
// elements are data (service-slots, the endpoints map), and so are all its
// changes, its creation and deletion included. A commit's cost follows the
// number of chains in the namespace, and a verdict it adds makes the kernel
// validate every chain and verdict map element it can reach: a chain per
// Service, or a verdict per Service, made both grow with N
// (test/bench/NOTES.md, "Item 3"). Built once per family: they never change.
var sharedPicks = map[family]func() sharedPickObjects{
	familyIPv4: sync.OnceValue(func() sharedPickObjects { return newSharedPicks(familyIPv4) }),
	familyIPv6: sync.OnceValue(func() sharedPickObjects { return newSharedPicks(familyIPv6) }),
}

type sharedPickObjects struct {
	chains   []*Chain
	elements map[string]map[string]Element // set -> keyID -> element
}

func newSharedPicks(f family) sharedPickObjects {
	o := sharedPickObjects{elements: map[string]map[string]Element{mapCountPick: {}, mapSlotPick: {}}}
	put := func(set string, key uint32, chain string) {
		e := Element{Key: slotKey(key), KeyText: fmt.Sprintf("0x%08x", key), Verdict: verdictGoto, Chain: chain}
		o.elements[set][keyID(e.Key, false)] = e
	}
	o.chains = append(o.chains, &Chain{Name: chainSharedPick, Rules: []Rule{
		newRule(f).ctMarkMaskedVMap(^uint32(maxSharedSlot), mapCountPick).build("")}})
	put(mapCountPick, 1<<countShift, slotChain(0))
	for n := 2; n <= maxSharedPick; n++ {
		o.chains = append(o.chains, &Chain{Name: sharedPickChain(n), Rules: []Rule{
			newRule(f).ctMarkSetSlot(uint32(n), 0).build(""),
			newRule(f).ctMarkVMap(mapSlotPick).build(""),
		}})
		put(mapCountPick, uint32(n)<<countShift, sharedPickChain(n))
	}
	for k := 0; k < maxSharedPick; k++ {
		o.chains = append(o.chains, &Chain{Name: slotChain(k), Rules: []Rule{
			newRule(f).ctMarkSetKeyMap(mapServiceSlots).build(""),
			newRule(f).ctMarkAndOr(maxSharedSlot, uint32(k)).build(""),
			newRule(f).verdict(expr.VerdictGoto, chainClusterDNAT).build(""),
		}})
		put(mapSlotPick, uint32(k), slotChain(k))
	}
	return o
}

// hookedChains are kp's base chains, those hooked into the kernel's packet
// path: each jumps to a static chain below.
func hookedChains(f family) []*Chain {
	jumpServices := newRule(f).verdict(expr.VerdictJump, chainServices).build("")
	checkNew := newRule(f).ctStateNew().verdict(expr.VerdictJump, chainEndpointsCheck).build("")
	checkClusterIPs := newRule(f).ctStateNew().verdict(expr.VerdictJump, chainClusterIPsCheck).build("")
	// Source ranges are checked when a connection starts, as upstream
	// does: a packet of an established one would pay a map lookup for
	// nothing.
	jumpFirewall := newRule(f).ctStateNew().verdict(expr.VerdictJump, chainFirewallCheck).build("")
	return []*Chain{
		baseChain("nat-prerouting", nftables.ChainTypeNAT, nftables.ChainHookPrerouting, "prerouting", -100, jumpServices),
		baseChain("nat-output", nftables.ChainTypeNAT, nftables.ChainHookOutput, "output", -100, jumpServices),
		baseChain("nat-postrouting", nftables.ChainTypeNAT, nftables.ChainHookPostrouting, "postrouting", 100,
			// Hairpin: after DNAT, a source equal to the destination is
			// a pod whose service connection came back to itself.
			newRule(f).ctStatusDNAT().addrPairInSet(setHairpin).verdict(expr.VerdictJump, chainMarkMasq).build(""),
			newRule(f).verdict(expr.VerdictJump, chainMasquerading).build("")),
		// loadBalancerSourceRanges are checked before DNAT, while the
		// packet is still addressed to the LoadBalancer IP.
		baseChain("filter-prerouting-pre-dnat", nftables.ChainTypeFilter, nftables.ChainHookPrerouting, "prerouting", -110, jumpFirewall),
		baseChain("filter-output-pre-dnat", nftables.ChainTypeFilter, nftables.ChainHookOutput, "output", -110, jumpFirewall),
		// Reject runs in filter hooks after DNAT: a packet still addressed
		// to a service address there found no endpoint (or a port the
		// Service does not have).
		// Not cluster-ips-check on input: a ClusterIP reaches input only
		// when it is a local address, on the dummy interface of an ipvs
		// proxy kp is taking over, whose IPVS serves it (a SYN that passed
		// nat before kp's first commit and met its filter after it would
		// be refused though IPVS was there to take it: 1 in 624 new
		// connections, once, in the VM); what IPVS does not serve, the
		// local stack refuses itself.
		baseChain("filter-input", nftables.ChainTypeFilter, nftables.ChainHookInput, "input", -10, checkNew),
		baseChain("filter-forward", nftables.ChainTypeFilter, nftables.ChainHookForward, "forward", -10, checkNew, checkClusterIPs),
		baseChain("filter-output", nftables.ChainTypeFilter, nftables.ChainHookOutput, "output", -10, checkNew, checkClusterIPs),
	}
}

// staticChains are the chains the base chains lead to, the same whatever
// the Services: they look packets up in the static maps and sets.
func (b *Backend) staticChains(f family) []*Chain {
	// A TCP packet that starts a conntrack entry without opening a
	// connection, addressed to this node, belongs to a flow someone else
	// serves without conntrack: upstream's ipvs mode, whose connections
	// to the ClusterIPs on its dummy interface can run without an entry.
	// DNAT or a reject would reset it (the ipvs take-over keeps such
	// virtual servers while their connections last); IPVS takes it in
	// LOCAL_IN.
	notOurs := newRule(f).l4proto(6).tcpNotSyn().fibDaddrLocal().verdict(expr.VerdictReturn, "").build("")
	return []*Chain{
		{Name: chainFirewallCheck, Rules: []Rule{newRule(f).keyVMap(true, mapFirewallIPs).build("")}},
		{Name: chainClusterIPsCheck, Rules: []Rule{
			notOurs,
			newRule(f).addrInSet(false, false, setClusterIPs).verdict(expr.VerdictGoto, chainReject).build(""),
			newRule(f).addrInSet(false, false, setServiceCIDRs).verdict(expr.VerdictDrop, "").build(""),
		}},
		// A ClusterIP of the Cluster policy without session affinity
		// has no chain of its own: its service-ips verdict jumps to
		// the chain that picks its endpoint slot, and on return this
		// rule sends it to the static DNAT. (Not "ct mark != 0": a CNI
		// may set ct marks.) Every Service chain less is a chain and
		// two jump rules less for the kernel to create and validate.
		// A ClusterIP picked by the shared chains has no verdict of its
		// own: its slots are data (see sharedPicks).
		{Name: chainServices, Rules: []Rule{
			notOurs,
			newRule(f).ctMarkSetKeyMap(mapServiceSlots).verdict(expr.VerdictGoto, chainSharedPick).build(""),
			newRule(f).keyVMap(true, mapServiceIPs).build(""),
			newRule(f).keyInSet(true, setClusterPicked).verdict(expr.VerdictGoto, chainClusterDNAT).build(""),
			newRule(f).addrInSet(false, false, setNodePortIPs).keyVMap(false, mapServiceNodePorts).build(""),
		}},
		{Name: chainEndpointsCheck, Rules: []Rule{
			notOurs,
			newRule(f).keyVMap(true, mapNoEndpointServices).build(""),
			newRule(f).addrInSet(false, false, setNodePortIPs).keyVMap(false, mapNoEndpointNodePorts).build(""),
		}},
		{Name: chainMarkMasq, Rules: []Rule{newRule(f).markOr(b.masqMark).build("")}},
		{Name: chainMasquerading, Rules: []Rule{
			newRule(f).markUnsetReturn(b.masqMark).build(""),
			newRule(f).markXor(b.masqMark).build(""),
			newRule(f).masquerade().build(""),
		}},
		// The one place that DNATs for Services without session
		// affinity: their chains only choose a slot. A rule with a NAT
		// expression makes the kernel validate the whole table when it
		// is added, so these are written once, never per Service.
		// The Cluster policy's masquerade decision, the same for every
		// Service, then the DNAT: one static chain rather than a rule in
		// each Service's chain (a rule per Service less in a full sync's
		// batch; test/bench/NOTES.md).
		{Name: chainClusterDNAT, Rules: append(b.clusterMasquerade(f, netip.Addr{}, ""),
			newRule(f).verdict(expr.VerdictGoto, chainEndpointDNAT).build(""))},
		{Name: chainEndpointDNAT, Rules: []Rule{
			newRule(f).dnatSlotMap(6, mapEndpoints).build(""),
			newRule(f).dnatSlotMap(17, mapEndpoints).build(""),
			newRule(f).dnatSlotMap(132, mapEndpoints).build(""),
		}},
		{Name: chainReject, Rules: []Rule{
			newRule(f).l4proto(6).rejectTCPReset().build(""),
			newRule(f).rejectPortUnreachable().build(""),
		}},
	}
}

// prefixElements encodes prefixes as the elements of an interval set. The
// kernel refuses overlapping intervals (nft merges them before sending), so a
// prefix inside another one is left out.
func prefixElements(ps []netip.Prefix) []Element {
	ps = slices.Clone(ps)
	for i := range ps {
		ps[i] = ps[i].Masked()
	}
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
	})
	var out []Element
	var last netip.Prefix
	for _, p := range ps {
		if last.IsValid() && last.Overlaps(p) {
			continue // sorted by address then length: p is inside last
		}
		last = p
		out = append(out, intervalElements(p)...)
	}
	return out
}

// intervalElements encodes a prefix as nft interval elements: the first
// address, and the address after the last one flagged as interval end.
func intervalElements(p netip.Prefix) []Element {
	p = p.Masked()
	first := p.Addr()
	es := []Element{{Key: addrKey(first), KeyText: p.String()}}
	last := lastAddr(p)
	if next := last.Next(); next.IsValid() {
		es = append(es, Element{Key: addrKey(next), KeyEnd: true, KeyText: p.String() + " (end)"})
	}
	return es
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
