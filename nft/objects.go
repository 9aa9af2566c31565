package nft

import (
	"net/netip"
	"sort"
)

// objects is a collection of nftables objects of one table (chains, sets,
// their elements, named counters), keyed for diff: the desired objects a
// State renders to (the whole table, or one service port's), or a scope,
// the objects a diff may delete. diff compares them with the tableRecord.
type objects struct {
	chains   map[string]*Chain
	sets     map[string]*Set
	elements map[string]map[string]Element // set → keyID → element
	counters map[string]bool               // only in scopes: an earlier kp's named counters, to delete
	// pods are the addresses of a rendered port's endpoints, whose
	// hairpin elements are counted, not rendered (see hairpins).
	pods []netip.Addr
	// blocks are the names of a rendered port's endpoint slot blocks
	// (see slotTable), or of the ports in a scope.
	blocks []string
	// spare holds the static sets' element maps of objects reset for
	// their next use (a full sync's group, and the objects each Service is
	// rendered into), emptied, for their capacity: growing the maps anew
	// for every group and Service was a large share of a cold start's
	// allocations (test/bench/NOTES.md).
	spare map[string]map[string]Element
}

func newObjects() *objects {
	return &objects{chains: map[string]*Chain{}, sets: map[string]*Set{}, elements: map[string]map[string]Element{}, counters: map[string]bool{}}
}

func (v *objects) addElement(set string, e Element) { v.putElement(set, keyID(e.Key, e.KeyEnd), e) }

// putElement adds e under its keyID k.
func (v *objects) putElement(set, k string, e Element) { v.elementMap(set)[k] = e }

// elementMap is set's elements, a spare map or a new one when v has none.
func (v *objects) elementMap(set string) map[string]Element {
	if m := v.elements[set]; m != nil {
		return m
	}
	m := v.spare[set]
	if m == nil {
		m = map[string]Element{}
	} else {
		delete(v.spare, set)
	}
	v.elements[set] = m
	return m
}

// staticSetNames are the names of staticSets, the only sets whose element
// maps reset keeps: every Service's rendering and every group of a full
// sync fills them again, where a Service's own sets (affinity, firewall)
// come once.
var staticSetNames = func() map[string]bool {
	m := map[string]bool{}
	for _, s := range staticSets(familyIPv4) {
		m[s.Name] = true
	}
	return m
}()

// reset empties v for its next use, keeping the element maps of the
// static sets.
func (v *objects) reset() {
	clear(v.chains)
	clear(v.sets)
	clear(v.counters)
	v.pods = v.pods[:0]
	v.blocks = v.blocks[:0]
	for set, m := range v.elements {
		if staticSetNames[set] {
			clear(m)
			if v.spare == nil {
				v.spare = map[string]map[string]Element{}
			}
			v.spare[set] = m
		}
	}
	clear(v.elements)
}

// merge adds o's objects to v.
func (v *objects) merge(o *objects) {
	if o == nil {
		return
	}
	v.mergeWithoutElements(o)
	v.blocks = append(v.blocks, o.blocks...)
	for s, es := range o.elements {
		for k, e := range es {
			v.putElement(s, k, e)
		}
	}
}

// mergeWithoutElements adds o's chains, sets and counters to v, not their elements.
func (v *objects) mergeWithoutElements(o *objects) {
	if o == nil {
		return
	}
	for n, c := range o.chains {
		v.chains[n] = c
	}
	for n, s := range o.sets {
		v.sets[n] = s
		v.elementMap(n)
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
