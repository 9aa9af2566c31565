package nft

import (
	"net/netip"
	"sort"
)

// view is a set of nftables objects: what kp wants (the whole table, or the
// objects of one service port), keyed for diffing against tableState.
type view struct {
	chains   map[string]*Chain
	sets     map[string]*Set
	elements map[string]map[string]Element // set → keyID → element
	counters map[string]bool               // only in scopes: an earlier kp's named counters, to delete
	// pods are the addresses of a rendered port's endpoints, whose
	// hairpin elements are counted, not rendered (see hairpins).
	pods []netip.Addr
}

func newView() *view {
	return &view{chains: map[string]*Chain{}, sets: map[string]*Set{}, elements: map[string]map[string]Element{}, counters: map[string]bool{}}
}

func (v *view) addElement(set string, e Element) { v.putElement(set, keyID(e.Key, e.KeyEnd), e) }

// putElement adds e under its keyID k.
func (v *view) putElement(set, k string, e Element) {
	m := v.elements[set]
	if m == nil {
		m = map[string]Element{}
		v.elements[set] = m
	}
	m[k] = e
}

// merge adds o's objects to v.
func (v *view) merge(o *view) {
	if o == nil {
		return
	}
	v.mergeObjects(o)
	for s, es := range o.elements {
		for k, e := range es {
			v.putElement(s, k, e)
		}
	}
}

// mergeObjects adds o's chains, sets and counters to v, not their elements.
func (v *view) mergeObjects(o *view) {
	if o == nil {
		return
	}
	for n, c := range o.chains {
		v.chains[n] = c
	}
	for n, s := range o.sets {
		v.sets[n] = s
		if v.elements[n] == nil {
			v.elements[n] = map[string]Element{}
		}
	}
	for n := range o.counters {
		v.counters[n] = true
	}
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
