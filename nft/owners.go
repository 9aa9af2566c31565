package nft

import (
	"cmp"
	"slices"

	"github.com/kpproxy/kp/proxy"
)

// footprint is what one service port wrote in one table, as kp keeps it
// between syncs: the names of its chains and sets and the keys of its
// elements, not their contents. (Its rules and element values are rendered
// again when needed: kp keeps a few dozen bytes per element, not the
// element.)
type footprint struct {
	name   proxy.ServicePortName
	chains []string
	sets   []string
	elems  []elemRef
}

// elemRef names one element: its set and its keyID.
type elemRef struct{ set, key string }

func footprintOf(name proxy.ServicePortName, v *view) *footprint {
	fp := &footprint{name: name, chains: make([]string, 0, len(v.chains))}
	for c := range v.chains {
		fp.chains = append(fp.chains, c)
	}
	for s := range v.sets {
		fp.sets = append(fp.sets, s)
	}
	n := 0
	for _, es := range v.elements {
		n += len(es)
	}
	fp.elems = make([]elemRef, 0, n)
	for set, es := range v.elements {
		for k := range es {
			fp.elems = append(fp.elems, elemRef{set, k})
		}
	}
	return fp
}

// scope is the footprint as a view of names and keys, for diff's scope.
func (fp *footprint) scope() *view {
	v := newView()
	for _, c := range fp.chains {
		v.chains[c] = &Chain{Name: c}
	}
	for _, s := range fp.sets {
		v.sets[s] = &Set{Name: s}
	}
	for _, r := range fp.elems {
		v.putElement(r.set, r.key, elementOfKey(r.set, r.key))
	}
	return v
}

// elementOwners records which service ports want each element of a shared
// set or map. Two ports of one Service share their ClusterIP in cluster-ips,
// two Services may share a pod (its hairpin element), and two Services may
// (by mistake) claim the same address and port: the element must stay while
// one of its owners still wants it, and a conflict must resolve the same way
// at every sync, whatever order changes came in: the first owner by name
// wins. Most keys have one owner, kept in first alone.
type elementOwners struct {
	first map[elemRef]*footprint   // the key's owner that comes first by name
	more  map[elemRef][]*footprint // its other owners, if any
}

func newElementOwners() *elementOwners {
	return &elementOwners{first: map[elemRef]*footprint{}, more: map[elemRef][]*footprint{}}
}

// unshared reports whether the elements of set have one owner by
// construction, which their footprint alone records: an endpoint slot
// belongs to one block, of one chain, of one service port. Not indexing
// them keeps about half of the keys out of elementOwners.
func unshared(set string) bool { return set == mapEndpoints }

// add records fp's elements as owned by it; remove forgets them.
func (o *elementOwners) add(fp *footprint) {
	for _, r := range fp.elems {
		if unshared(r.set) {
			continue
		}
		cur := o.first[r]
		switch {
		case cur == nil:
			o.first[r] = fp
		case compareNames(fp.name, cur.name) < 0:
			o.more[r] = append(o.more[r], cur)
			o.first[r] = fp
		default:
			o.more[r] = append(o.more[r], fp)
		}
	}
}

func (o *elementOwners) remove(fp *footprint) {
	for _, r := range fp.elems {
		if unshared(r.set) {
			continue
		}
		others := o.more[r]
		switch {
		case o.first[r] != fp:
			others = slices.DeleteFunc(others, func(x *footprint) bool { return x == fp })
		case len(others) == 0:
			delete(o.first, r)
		default: // the next owner by name takes the key
			i := 0
			for j := range others {
				if compareNames(others[j].name, others[i].name) < 0 {
					i = j
				}
			}
			o.first[r] = others[i]
			others = slices.Delete(others, i, i+1)
		}
		if len(others) == 0 {
			delete(o.more, r)
		} else {
			o.more[r] = others
		}
	}
}

// owner is the footprint whose element the key gets, nil when nobody owns
// it (and for the keys of unshared sets, which it does not index).
func (o *elementOwners) owner(r elemRef) *footprint { return o.first[r] }

func compareNames(a, b proxy.ServicePortName) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name),
		cmp.Compare(a.Port, b.Port), cmp.Compare(a.Protocol, b.Protocol))
}
