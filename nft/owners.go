package nft

import (
	"cmp"
	"slices"

	"github.com/kpproxy/kp/proxy"
)

// elementOwners records which service ports want each element of a shared
// set or map. Two ports of one Service share their ClusterIP in cluster-ips,
// and two Services may (by mistake) claim the same address and port: the
// element must stay while one of its owners still wants it, and a conflict
// must resolve the same way at every sync, whatever order changes came in.
type elementOwners map[string]map[string][]ownedElement // set → key → owners

type ownedElement struct {
	owner proxy.ServicePortName
	elem  Element
}

// add records v's elements as owned by name; remove forgets them.
func (o elementOwners) add(name proxy.ServicePortName, v *view) {
	for set, es := range v.elements {
		m := o[set]
		if m == nil {
			m = map[string][]ownedElement{}
			o[set] = m
		}
		for k, e := range es {
			m[k] = append(m[k], ownedElement{owner: name, elem: e})
		}
	}
}

func (o elementOwners) remove(name proxy.ServicePortName, v *view) {
	for set, es := range v.elements {
		for k := range es {
			owners := slices.DeleteFunc(o[set][k], func(x ownedElement) bool { return x.owner == name })
			if len(owners) == 0 {
				delete(o[set], k)
			} else {
				o[set][k] = owners
			}
		}
	}
}

// resolve returns, for every element key in scope, the element its first
// owner (by name) wants, leaving out keys nobody owns any more.
func (o elementOwners) resolve(scope *view) map[string]map[string]Element {
	out := map[string]map[string]Element{}
	for set, es := range scope.elements {
		for k := range es {
			owners := o[set][k]
			if len(owners) == 0 {
				continue
			}
			first := slices.MinFunc(owners, func(a, b ownedElement) int { return compareNames(a.owner, b.owner) })
			if out[set] == nil {
				out[set] = map[string]Element{}
			}
			out[set][k] = first.elem
		}
	}
	return out
}

func compareNames(a, b proxy.ServicePortName) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name),
		cmp.Compare(a.Port, b.Port), cmp.Compare(a.Protocol, b.Protocol))
}
