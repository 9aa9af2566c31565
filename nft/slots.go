package nft

import (
	"encoding/binary"
	"iter"
	"math/bits"
	"net/netip"
)

// Endpoint slots. A traffic policy's pick (without session affinity) picks
// a slot at random from its own contiguous block; the packet then goes to
// the static endpoint-dnat chain (through cluster-dnat for the Cluster
// policy), whose one DNAT rule per protocol looks the slot up in the
// endpoints map. A new connection walks the same few rules whatever the
// number of endpoints, and an endpoint change rewrites map elements, not a
// rule holding NAT.
//
// A block of up to maxSharedPick endpoints is picked by static chains
// shared by every Service (see sharedPickChains): the block's base goes
// into the connection's mark (from the service-base map for a ClusterIP,
// from the rule for external traffic), pick-n chooses k below n, and
// slot-k sets the mark's low bits to k. Blocks are aligned to their size,
// a power of two, so base | k is slot base+k. A larger block has a pick
// chain of its own ("ct mark set numgen random mod n offset base").
//
// Allocation rules, per table and per block, named as the pick chain of its
// traffic policy (pick-svc-…, pick-local-…) whether or not that chain exists:
//   - A block holds a power of two of slots, twice what the chain's endpoint
//     count needs (at least 8); it keeps its base while the count fits, so
//     that growing or shrinking changes only the chain's "mod n" and the
//     elements involved.
//   - An endpoint keeps its slot while it stays (its element, and so its
//     counter, is untouched). A leaving endpoint's slot is filled by the
//     last one of the block, so the used slots stay base…base+n-1; the moved
//     endpoint's counter restarts.
//   - A block too small is given up for a new one (blockSize): every
//     endpoint moves, and their counts restart. Blocks given up (or of chains that went away) are
//     reused by chains of the same block size.
//   - A block's base is a multiple of its size; the gaps alignment leaves
//     are split into free blocks of smaller sizes.
//   - Slot 0 is never used: 0 is a connection's mark when nothing set it.

// slotBlock is one chain's block of slots: eps.at(i) is in slot base+i.
type slotBlock struct {
	base, size uint32
	eps        slotEndpoints
}

// slotEndpoints is a block's endpoints in slot order, packed: address and
// port in 6 bytes each when all are IPv4, 18 when not, rather than
// netip.AddrPort values (32 bytes, each with a pointer for the collector to
// follow; measures in test/bench/NOTES.md).
type slotEndpoints struct {
	b     []byte
	width uint8
}

func packSlots(eps []netip.AddrPort) slotEndpoints {
	s := slotEndpoints{width: 6}
	for _, e := range eps {
		if !e.Addr().Is4() {
			s.width = 18
		}
	}
	s.b = make([]byte, 0, len(eps)*int(s.width))
	for _, e := range eps {
		if s.width == 6 {
			a := e.Addr().As4()
			s.b = append(s.b, a[:]...)
		} else {
			a := e.Addr().As16()
			s.b = append(s.b, a[:]...)
		}
		s.b = binary.BigEndian.AppendUint16(s.b, e.Port())
	}
	return s
}

func (s slotEndpoints) len() int {
	if s.width == 0 {
		return 0
	}
	return len(s.b) / int(s.width)
}

func (s slotEndpoints) at(i int) netip.AddrPort {
	e := s.b[i*int(s.width) : (i+1)*int(s.width)]
	n := len(e) - 2
	var a netip.Addr
	if n == 4 {
		a = netip.AddrFrom4([4]byte(e[:4]))
	} else {
		a = netip.AddrFrom16([16]byte(e[:16]))
	}
	return netip.AddrPortFrom(a, binary.BigEndian.Uint16(e[n:]))
}

// all yields each slot's index in the block and its endpoint.
func (s slotEndpoints) all() iter.Seq2[int, netip.AddrPort] {
	return func(yield func(int, netip.AddrPort) bool) {
		for i := range s.len() {
			if !yield(i, s.at(i)) {
				return
			}
		}
	}
}

// unpacked returns the endpoints as values.
func (s slotEndpoints) unpacked() []netip.AddrPort {
	out := make([]netip.AddrPort, 0, s.len())
	for _, e := range s.all() {
		out = append(out, e)
	}
	return out
}

// slotTable allocates the blocks of one table.
type slotTable struct {
	blocks map[string]*slotBlock // by block name (the policy's pick chain name)
	free   map[uint32][]uint32   // block size → bases
	next   uint32
	// seen lists the blocks assigned during the current sync.
	seen map[string]bool
}

func newSlotTable() *slotTable {
	return &slotTable{blocks: map[string]*slotBlock{}, free: map[uint32][]uint32{}, next: minBlock}
}

// assign returns chain's block holding exactly eps (in some order), keeping
// the slots of endpoints it held before.
func (t *slotTable) assign(chain string, eps []netip.AddrPort) *slotBlock {
	if t.seen != nil {
		t.seen[chain] = true
	}
	blk := t.blocks[chain]
	if blk != nil && uint32(len(eps)) > blk.size {
		t.release(chain)
		blk = nil
	}
	if blk == nil {
		size := blockSize(len(eps))
		blk = &slotBlock{base: t.alloc(size), size: size}
		t.blocks[chain] = blk
		// A new block holds eps in their order: nothing to keep, and they
		// are distinct (the core merges endpoints by address and port).
		blk.eps = packSlots(eps)
		return blk
	}
	want := make(map[netip.AddrPort]bool, len(eps))
	for _, e := range eps {
		want[e] = true
	}
	// Keep who stays where it is; fill the holes from the end.
	kept := make([]netip.AddrPort, 0, blk.eps.len())
	held := map[netip.AddrPort]bool{}
	for _, e := range blk.eps.all() {
		if want[e] && !held[e] {
			held[e] = true
			kept = append(kept, e)
		} else {
			kept = append(kept, netip.AddrPort{})
		}
	}
	var added []netip.AddrPort
	for _, e := range eps {
		if !held[e] {
			held[e] = true
			added = append(added, e)
		}
	}
	for i := 0; i < len(kept); i++ {
		if kept[i].IsValid() {
			continue
		}
		if len(added) > 0 {
			kept[i], added = added[0], added[1:]
			continue
		}
		// No newcomer for this hole: the last endpoint moves in.
		for len(kept) > 0 && !kept[len(kept)-1].IsValid() {
			kept = kept[:len(kept)-1]
		}
		if i < len(kept) {
			kept[i] = kept[len(kept)-1]
			kept = kept[:len(kept)-1]
		}
	}
	blk.eps = packSlots(append(kept, added...))
	return blk
}

// blockSize is the block for n endpoints: twice the power of two that
// holds them, at least minBlock, so that a Deployment scaled up by some
// keeps its slots (and its endpoints' counts). 32-bit marks leave room:
// 100,000 Services of 10 endpoints take 3.2 million slots.
func blockSize(n int) uint32 {
	return max(minBlock, uint32(2)<<bits.Len32(uint32(max(n, 1))-1))
}

const minBlock = 8

// alloc returns the base of a free block of size slots (a power of two),
// a multiple of size. The first block starts at minBlock, so that slot 0
// stays unused.
func (t *slotTable) alloc(size uint32) uint32 {
	if fs := t.free[size]; len(fs) > 0 {
		base := fs[len(fs)-1]
		t.free[size] = fs[:len(fs)-1]
		return base
	}
	base := (t.next + size - 1) &^ (size - 1)
	// The gap before base: each step frees the largest block that is
	// aligned where the gap starts and fits in it (next is a multiple of
	// minBlock, and so is base).
	for t.next < base {
		step := t.next & -t.next // next's alignment
		for step > base-t.next {
			step >>= 1
		}
		t.free[step] = append(t.free[step], t.next)
		t.next += step
	}
	t.next = base + size
	return base
}

// release gives chain's block back.
func (t *slotTable) release(chain string) {
	if blk := t.blocks[chain]; blk != nil {
		t.free[blk.size] = append(t.free[blk.size], blk.base)
		delete(t.blocks, chain)
	}
}

// releaseUnseen gives back the blocks named in scope (all blocks when
// scope is nil) that the current sync did not assign: their Service port
// went away, lost that policy's endpoints, or took session affinity.
// Blocks are given back after the sync's rendering, so none is handed to
// another chain in the sync that frees it.
//
// With a scope, only its blocks are looked at: a partial sync touches a
// few, and walking every block made each endpoint change O(N)
// (test/bench/NOTES.md).
func (t *slotTable) releaseUnseen(scope []string, all bool) {
	if all {
		for chain := range t.blocks {
			if !t.seen[chain] {
				t.release(chain)
			}
		}
		return
	}
	for _, name := range scope {
		if !t.seen[name] {
			t.release(name)
		}
	}
}

// slotKey is a slot as the endpoints map's key: a ct mark, in host byte
// order as the kernel loads it into a register.
func slotKey(slot uint32) []byte {
	k := make([]byte, 4)
	binary.NativeEndian.PutUint32(k, slot)
	return k
}

// slotData is an endpoint as the endpoints map's data: "address . port",
// each padded to a 32-bit register.
func slotData(a netip.AddrPort) []byte {
	return append(pad4(a.Addr().AsSlice()), pad4(binary.BigEndian.AppendUint16(nil, a.Port()))...)
}

// The endpoints map holds, for every slot of every block, the endpoint the
// slot table puts there, after every successful sync: kp's record of the
// kernel keeps none of its elements between syncs, which would duplicate
// the slot table (test/bench/NOTES.md, "Memory (issue 14)"). A sync puts
// back in the record the elements of the blocks it may change, as they
// are before it changes them (recallSlots), and forgets them after its
// diff (tableRecord.forgetDerived). A full sync after a read of the kernel
// diffs against the elements read; a failed sync leaves the slot table
// ahead of the kernel, and is followed by such a full sync.

// recallSlots puts in the record the endpoints map's elements of fp's
// blocks, as the slot table holds them. Call it before fp's port is
// rendered again: rendering assigns its blocks anew.
func recallSlots(m *tableRecord, slots *slotTable, fp *footprint) {
	es := m.elements[mapEndpoints]
	if es == nil {
		es = map[string]uint64{}
		m.elements[mapEndpoints] = es
	}
	for _, c := range fp.blocks {
		blk := slots.blocks[c]
		if blk == nil {
			continue
		}
		for i, a := range blk.eps.all() {
			e := Element{Data: slotData(a)}
			es[keyID(slotKey(blk.base+uint32(i)), false)] = e.digest()
		}
	}
}
