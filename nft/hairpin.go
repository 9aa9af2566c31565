package nft

import (
	"iter"
	"net/netip"
	"slices"
)

// The hairpin set holds "a . a" for every pod address a that a service
// port has an endpoint at: a pod that reached itself through a Service is
// masqueraded, so that its reply comes back through the node. A pod behind
// several Services (or ports) has one element, there while one of them
// still has an endpoint at it.
//
// kp books the set as a count per pod, not as elements: a footprint lists
// the addresses of its port's pods, hairpins counts the footprints listing
// each, and the element is added when a pod's count leaves 0 and deleted
// when it returns to 0. The set holds exactly the counted pods after every
// successful sync, so kp's record of the kernel keeps none of its elements
// between syncs: a sync puts in the record the elements it touches, as they
// were before it (see recallHairpins), and forgets them after. Booked as
// elements, each pod took a footprint's reference, an owner and a record
// entry; a count takes a few bytes (test/bench/NOTES.md, "Memory (issue 14)").

// podAddrs is the distinct addresses of a service port's pods, each in
// its raw form (4 bytes in the ip table, 16 in ip6), concatenated.
type podAddrs string

// podAddrsOf is addrs, of one family, without repeats.
func podAddrsOf(addrs []netip.Addr) podAddrs {
	addrs = slices.Clone(addrs)
	slices.SortFunc(addrs, netip.Addr.Compare)
	addrs = slices.Compact(addrs)
	var b []byte
	for _, a := range addrs {
		b = append(b, a.AsSlice()...)
	}
	return podAddrs(b)
}

// all yields the addresses, read as family f's.
func (p podAddrs) all(f family) iter.Seq[netip.Addr] {
	n := 4
	if f.v6 {
		n = 16
	}
	return func(yield func(netip.Addr) bool) {
		for i := 0; i+n <= len(p); i += n {
			a, _ := netip.AddrFromSlice([]byte(p[i : i+n]))
			if !yield(a) {
				return
			}
		}
	}
}

// hairpins counts, per pod address, the footprints of one table listing
// it.
type hairpins struct {
	f     family
	count podCounter
}

func newHairpins(f family) *hairpins {
	if f.v6 {
		return &hairpins{f: f, count: podCounts[[16]byte]{m: map[[16]byte]int32{}, key: netip.Addr.As16, addr: netip.AddrFrom16}}
	}
	return &hairpins{f: f, count: podCounts[[4]byte]{m: map[[4]byte]int32{}, key: netip.Addr.As4, addr: netip.AddrFrom4}}
}

// has reports whether the set wants a's element.
func (h *hairpins) has(a netip.Addr) bool { return h.count.get(a) > 0 }

// add counts p's pods once more; it returns those that were counted
// nowhere before.
func (h *hairpins) add(p podAddrs) (first []netip.Addr) {
	for a := range p.all(h.f) {
		if h.count.add(a, 1) == 1 {
			first = append(first, a)
		}
	}
	return first
}

// remove counts p's pods once less.
func (h *hairpins) remove(p podAddrs) {
	for a := range p.all(h.f) {
		h.count.add(a, -1)
	}
}

// pods yields every counted pod.
func (h *hairpins) pods() iter.Seq[netip.Addr] { return h.count.all() }

// podCounter is a count per pod address of one family.
type podCounter interface {
	get(a netip.Addr) int32
	// add adds d to a's count and returns the new count; a count that
	// reaches 0 is forgotten.
	add(a netip.Addr, d int32) int32
	all() iter.Seq[netip.Addr]
}

// podCounts keys the counts by an address's raw bytes, 4 in the ip table
// and 16 in ip6: no pointer for the collector to follow, and a smaller
// entry in the ip table (test/bench/NOTES.md).
type podCounts[K comparable] struct {
	m    map[K]int32
	key  func(netip.Addr) K
	addr func(K) netip.Addr
}

func (c podCounts[K]) get(a netip.Addr) int32 { return c.m[c.key(a)] }

func (c podCounts[K]) add(a netip.Addr, d int32) int32 {
	k := c.key(a)
	n := c.m[k] + d
	if n <= 0 {
		delete(c.m, k)
		return 0
	}
	c.m[k] = n
	return n
}

func (c podCounts[K]) all() iter.Seq[netip.Addr] {
	return func(yield func(netip.Addr) bool) {
		for k := range c.m {
			if !yield(c.addr(k)) {
				return
			}
		}
	}
}

// hairpinPod is the pod whose element has key id, if it is one ("a . a").
func hairpinPod(id string) (netip.Addr, bool) {
	k := keyBytes(id)
	if n := len(k) / 2; n == 4 || n == 16 {
		if a, b := k[:n], k[n:]; string(a) == string(b) {
			addr, _ := netip.AddrFromSlice(a)
			return addr, true
		}
	}
	return netip.Addr{}, false
}

// recallHairpins puts in the record the hairpin elements of pods as the
// kernel holds them before this sync changes a count: present when
// counted. The record keeps them for the sync's diff only (forgetDerived).
func recallHairpins(m *tableRecord, h *hairpins, pods iter.Seq[netip.Addr]) {
	es := m.elements[setHairpin]
	if es == nil {
		es = map[string]uint64{}
		m.elements[setHairpin] = es
	}
	for a := range pods {
		if h.has(a) {
			e := hairpinElement(a)
			es[keyID(e.Key, false)] = e.digest()
		}
	}
}
