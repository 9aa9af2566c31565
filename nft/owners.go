package nft

import (
	"cmp"
	"encoding/binary"
	"hash/maphash"
	"slices"
	"unique"

	"github.com/kpproxy/kp/proxy"
)

// footprint is what one service port wrote in one table, as kp keeps it
// between syncs: the names of its chains and sets and the keys of its
// elements, not their contents. (Its rules and element values are rendered
// again when needed: kp keeps a few dozen bytes per element, not the
// element.) Its endpoint slots, the endpoints map's keys, are kept as runs
// of slot numbers: a block's used slots are contiguous (see slotTable), so
// a port's ten slots take 8 bytes, not ten key references; its blocks are
// named (by which the slot table knows them). Its pods, the
// hairpin set's share, are kept as their addresses (see hairpins).
type footprint struct {
	name   proxy.ServicePortName
	chains []string
	sets   []string
	blocks []string  // its endpoint slot blocks' names
	elems  []elemRef // of every set but the endpoints map and the hairpin set
	slots  []slotRun // the endpoints map's keys
	pods   podAddrs
}

// elemRef names one element: its set and its keyID. The set's name is
// interned (a handle is 8 bytes where a string is 16): a footprint holds a
// dozen references per service port.
type elemRef struct {
	set unique.Handle[string]
	key string
}

func refTo(set, key string) elemRef { return elemRef{unique.Make(set), key} }

// setName is the referenced element's set.
func (r elemRef) setName() string { return r.set.Value() }

// slotRun is the endpoint slots first … first+n-1.
type slotRun struct{ first, n uint32 }

func footprintOf(name proxy.ServicePortName, v *objects) *footprint {
	fp := &footprint{name: name, chains: make([]string, 0, len(v.chains)), pods: podAddrsOf(v.pods)}
	if len(v.blocks) > 0 {
		fp.blocks = slices.Clone(v.blocks)
	}
	for c := range v.chains {
		fp.chains = append(fp.chains, c)
	}
	for s := range v.sets {
		fp.sets = append(fp.sets, s)
	}
	n := 0
	for set, es := range v.elements {
		if set != mapEndpoints {
			n += len(es)
		}
	}
	fp.elems = make([]elemRef, 0, n)
	for set, es := range v.elements {
		if set == mapEndpoints {
			fp.slots = slotRuns(es)
			continue
		}
		for k := range es {
			fp.elems = append(fp.elems, refTo(set, k))
		}
	}
	return fp
}

// slotRuns returns the slots of the endpoints map's elements es as runs.
func slotRuns(es map[string]Element) []slotRun {
	slots := make([]uint32, 0, len(es))
	for k := range es {
		slots = append(slots, slotOfKeyID(k))
	}
	slices.Sort(slots)
	var runs []slotRun
	for _, s := range slots {
		if l := len(runs) - 1; l >= 0 && runs[l].first+runs[l].n == s {
			runs[l].n++
			continue
		}
		runs = append(runs, slotRun{s, 1})
	}
	return slices.Clip(runs)
}

// slotOfKeyID is the slot an endpoints map key (a keyID of slotKey) holds.
func slotOfKeyID(id string) uint32 {
	k := keyBytes(id)
	if len(k) != 4 {
		return 0 // not kp's: slot 0 is never used
	}
	return binary.NativeEndian.Uint32(k)
}

// hasSlot reports whether fp's endpoint slots include slot.
func (fp *footprint) hasSlot(slot uint32) bool {
	for _, r := range fp.slots {
		if slot >= r.first && slot-r.first < r.n {
			return true
		}
	}
	return false
}

// has reports whether fp holds the element r.
func (fp *footprint) has(r elemRef) bool {
	if r.setName() == mapEndpoints {
		return fp.hasSlot(slotOfKeyID(r.key))
	}
	return slices.Contains(fp.elems, r)
}

// scope is the footprint as objects of names and keys, for diff's scope.
func (fp *footprint) scope() *objects {
	v := newObjects()
	v.blocks = fp.blocks
	for _, c := range fp.chains {
		v.chains[c] = &Chain{Name: c}
	}
	for _, s := range fp.sets {
		v.sets[s] = &Set{Name: s}
	}
	for _, r := range fp.elems {
		set := r.setName()
		v.putElement(set, r.key, elementOfKey(set, r.key))
	}
	for _, r := range fp.slots {
		for s := r.first; s < r.first+r.n; s++ {
			k := keyID(slotKey(s), false)
			v.putElement(mapEndpoints, k, elementOfKey(mapEndpoints, k))
		}
	}
	return v
}

// elementOwners records which service ports want each element of a shared
// set or map. Two ports of one Service share their ClusterIP in cluster-ips,
// two Services may share a pod (its hairpin element), and two Services may
// (by mistake) claim the same address and port: the element must stay while
// one of its owners still wants it, and a conflict must resolve the same way
// at every sync, whatever order changes came in: the first owner by name
// wins.
//
// It is indexed by a 64-bit hash of the key, not the key: an entry keyed by
// two strings took three times the memory (test/bench/NOTES.md). The owners listed under a
// hash are those of every key with that hash, so owner checks the
// footprints it finds: a collision costs a comparison, never a wrong
// owner. Most hashes have one owner, kept in first alone.
type elementOwners struct {
	seed   maphash.Seed
	hashOf func(elemRef) uint64    // nil: maphash with seed (tests make collisions)
	first  map[uint64]*footprint   // the first by name of the owners of the keys with this hash
	more   map[uint64][]*footprint // their other owners, if any (a footprint once per key it has)
}

func newElementOwners() *elementOwners {
	return &elementOwners{seed: maphash.MakeSeed(), first: map[uint64]*footprint{}, more: map[uint64][]*footprint{}}
}

func (o *elementOwners) hash(r elemRef) uint64 {
	if o.hashOf != nil {
		return o.hashOf(r)
	}
	return maphash.Comparable(o.seed, r)
}

// unshared reports whether the elements of set have one owner by
// construction, which their footprint alone records: an endpoint slot
// belongs to one block, of one chain, of one service port. Their keys are
// neither in a footprint's elems nor in elementOwners.
func unshared(set string) bool { return set == mapEndpoints }

// add records fp's elements as owned by it; remove forgets them.
func (o *elementOwners) add(fp *footprint) {
	for _, r := range fp.elems {
		h := o.hash(r)
		cur := o.first[h]
		switch {
		case cur == nil:
			o.first[h] = fp
		case compareNames(fp.name, cur.name) < 0:
			o.more[h] = append(o.more[h], cur)
			o.first[h] = fp
		default:
			o.more[h] = append(o.more[h], fp)
		}
	}
}

func (o *elementOwners) remove(fp *footprint) {
	for _, r := range fp.elems {
		h := o.hash(r)
		others := o.more[h]
		switch {
		case o.first[h] != fp:
			if i := slices.Index(others, fp); i >= 0 {
				others = slices.Delete(others, i, i+1)
			}
		case len(others) == 0:
			delete(o.first, h)
		default: // the next owner by name comes first
			i := 0
			for j := range others {
				if compareNames(others[j].name, others[i].name) < 0 {
					i = j
				}
			}
			o.first[h] = others[i]
			others = slices.Delete(others, i, i+1)
		}
		if len(others) == 0 {
			delete(o.more, h)
		} else {
			o.more[h] = others
		}
	}
}

// owner is the footprint whose element the key gets, nil when nobody owns
// it (and for the keys of unshared sets, which it does not index).
func (o *elementOwners) owner(r elemRef) *footprint {
	h := o.hash(r)
	var best *footprint
	if fp := o.first[h]; fp != nil && fp.has(r) {
		best = fp
	}
	for _, fp := range o.more[h] {
		if (best == nil || compareNames(fp.name, best.name) < 0) && fp.has(r) {
			best = fp
		}
	}
	return best
}

func compareNames(a, b proxy.ServicePortName) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name),
		cmp.Compare(a.Port, b.Port), cmp.Compare(a.Protocol, b.Protocol))
}
