package nft

import (
	"cmp"
	"slices"
	"strings"

	"github.com/kpproxy/kp/proxy"
)

// diff appends to tx what turns the kernel's table (as record has it) into
// desired, for the objects in scope: a scoped object absent from desired is
// deleted; an object in desired that differs from the record is written.
// record is updated as if tx succeeds (the caller re-reads the kernel when
// it does not).
//
// Order matters within the one batch, which the kernel checks as it goes:
// what a rule or element names (chains, sets) exists before it;
// a set declared anew (its timeout changed) is deleted only after the rules
// naming it are flushed; references to a chain or set go before it does.
// Each step below appends its operations after the previous step's.
func diff(tx *Transaction, f family, record *tableRecord, desired, scope *objects) {
	replaced := declareSets(tx, f, record, desired)
	rewritten := addOrFlushChains(tx, f, record, desired, replaced)
	for _, s := range replaced {
		tx.delSet(f, s)
		tx.addSet(f, s)
	}
	addRules(tx, f, rewritten)
	deleteUnwantedElements(tx, f, record, desired, scope)
	writeElements(tx, f, record, desired, scope)
	deleteGoneObjects(tx, f, record, desired, scope)
}

// declareSets adds the desired sets the record lacks, and returns those
// whose declaration changed: diff deletes and adds them again once the
// chains naming them are flushed. Either way their elements are written
// anew.
func declareSets(tx *Transaction, f family, record *tableRecord, desired *objects) (replaced []*Set) {
	for _, name := range sortedKeys(desired.sets) {
		s := desired.sets[name]
		cur, exists := record.sets[name]
		switch {
		case !exists:
			tx.addSet(f, s)
			record.elements[name] = map[string]uint64{}
		case cur != s.digest():
			replaced = append(replaced, s)
			record.elements[name] = map[string]uint64{}
		}
		record.sets[name] = s.digest()
	}
	return replaced
}

// addOrFlushChains adds the desired chains the record lacks and flushes
// those that changed, and returns both, whose rules are to be written. A
// chain that exists is flushed and rewritten in the same batch, so packets
// see either its old or its new rules, never none. Chains that name a
// replaced set are rewritten whatever their digest.
func addOrFlushChains(tx *Transaction, f family, record *tableRecord, desired *objects, replaced []*Set) (rewritten []*Chain) {
	for _, name := range sortedKeys(desired.chains) {
		c := desired.chains[name]
		d := c.digest()
		old, exists := record.chains[name]
		if exists && old == d && !namesAny(c, replaced) {
			continue
		}
		if exists {
			tx.flushChain(f, c)
		} else {
			tx.addChain(f, c)
		}
		rewritten = append(rewritten, c)
		record.chains[name] = d
	}
	return rewritten
}

// addRules writes the rules of chains, just added or flushed.
func addRules(tx *Transaction, f family, chains []*Chain) {
	rules := 0
	for _, c := range chains {
		rules += len(c.Rules)
	}
	tx.ops = slices.Grow(tx.ops, rules) // a full sync adds 100,000s: grow once
	for _, c := range chains {
		for i := range c.Rules {
			tx.addRule(f, c, &c.Rules[i])
		}
	}
}

// deleteUnwantedElements deletes the elements in scope that desired does
// not hold, from the sets that stay.
func deleteUnwantedElements(tx *Transaction, f family, record *tableRecord, desired, scope *objects) {
	for _, set := range sortedKeys(scope.elements) {
		if goneSet(set, desired, scope) {
			continue // its elements go with it
		}
		var del []Element
		for _, k := range sortedKeys(scope.elements[set]) {
			e := scope.elements[set][k]
			if _, keep := desired.elements[set][k]; keep {
				continue
			}
			// Whatever value it has: no service port wants the key
			// any more (desired holds every key one still owns).
			if _, ok := record.elements[set][k]; ok {
				del = append(del, e)
				delete(record.elements[set], k)
			}
		}
		tx.delElements(f, setOf(f, set, desired, scope), del)
	}
}

// writeElements adds the desired elements the record lacks, and replaces
// (deletes, then adds) those whose value changed.
func writeElements(tx *Transaction, f family, record *tableRecord, desired, scope *objects) {
	for _, set := range sortedKeys(desired.elements) {
		var del []Element
		add := tx.elementsFor(len(desired.elements[set])) // in a full sync, nearly all of them
		m := record.elements[set]
		if m == nil {
			m = map[string]uint64{}
			record.elements[set] = m
		}
		for _, k := range elementOrder(desired.elements[set]) {
			e := desired.elements[set][k]
			d := e.digest()
			cur, ok := m[k]
			if ok && cur == d {
				continue
			}
			if ok {
				del = append(del, e)
			}
			add = append(add, e)
			m[k] = d
		}
		s := setOf(f, set, desired, scope)
		tx.delElements(f, s, del)
		tx.addElements(f, s, add)
	}
}

// deleteGoneObjects deletes the chains, sets and named counters in scope
// that desired does not hold and the kernel has.
func deleteGoneObjects(tx *Transaction, f family, record *tableRecord, desired, scope *objects) {
	var gone []*Chain
	for _, name := range sortedKeys(scope.chains) {
		if _, keep := desired.chains[name]; keep {
			continue
		}
		if _, ok := record.chains[name]; ok {
			gone = append(gone, &Chain{Name: name})
			delete(record.chains, name)
		}
	}
	// Rules name sets and map elements name chains: flush the chains, then
	// delete the sets, then the chains.
	for _, c := range gone {
		tx.flushChain(f, c)
	}
	for _, name := range sortedKeys(scope.sets) {
		if _, ok := record.sets[name]; ok && goneSet(name, desired, scope) {
			tx.delSet(f, scope.sets[name])
			delete(record.sets, name)
			delete(record.elements, name)
		}
	}
	for _, c := range gone {
		tx.delChain(f, c)
	}
	for _, name := range sortedKeys(scope.counters) {
		if desired.counters[name] || !record.counters[name] {
			continue
		}
		tx.delCounter(f, name)
		delete(record.counters, name)
	}
}

func goneSet(name string, desired, scope *objects) bool {
	_, inScope := scope.sets[name]
	_, wanted := desired.sets[name]
	return inScope && !wanted
}

// namesAny reports whether a rule of c refers to one of sets.
func namesAny(c *Chain, sets []*Set) bool {
	for _, s := range sets {
		for i := range c.Rules {
			if strings.Contains(c.Rules[i].Text, "@"+s.Name+" ") || strings.HasSuffix(c.Rules[i].Text, "@"+s.Name) {
				return true
			}
		}
	}
	return false
}

// setOf returns the declaration of the named set: from the objects when one
// declares it, else kp's static one (element operations only need its name
// and key type).
func setOf(f family, name string, from ...*objects) *Set {
	for _, v := range from {
		if s := v.sets[name]; s != nil && s.KeyType.Bytes != 0 {
			return s
		}
	}
	return setByName(f, name)
}

// goneFromRecord lists, as a scope for diff, what the record holds that
// nobody wants: chains and sets that neither the skeleton nor a footprint
// names, elements whose key no service port owns (nor the skeleton, nor the
// hairpin counts), and any named counter. With nothing desired, diff
// deletes them all, in the kernel's order.
func goneFromRecord(m *tableRecord, skel *objects, owned map[proxy.ServicePortName]*footprint, owners *elementOwners, hairpins *hairpins) *objects {
	chains, sets, slots := map[string]bool{}, map[string]bool{}, map[uint32]bool{}
	for name := range skel.chains {
		chains[name] = true
	}
	for name := range skel.sets {
		sets[name] = true
	}
	for _, fp := range owned {
		for _, c := range fp.chains {
			chains[c] = true
		}
		for _, s := range fp.sets {
			sets[s] = true
		}
		for _, r := range fp.slots {
			for s := r.first; s < r.first+r.n; s++ {
				slots[s] = true
			}
		}
	}
	v := newObjects()
	for name := range m.chains {
		if !chains[name] {
			v.chains[name] = &Chain{Name: name}
		}
	}
	for name := range m.sets {
		if !sets[name] {
			v.sets[name] = &Set{Name: name}
		}
	}
	for set, es := range m.elements {
		for k := range es {
			if _, ok := skel.elements[set][k]; ok {
				continue
			}
			if wanted(set, k, slots, owners, hairpins) {
				continue
			}
			v.addElement(set, elementOfKey(set, k))
		}
	}
	for name := range m.counters {
		v.counters[name] = true
	}
	return v
}

// wanted reports whether a service port wants the element k of set.
func wanted(set, k string, slots map[uint32]bool, owners *elementOwners, hairpins *hairpins) bool {
	switch {
	case set == setHairpin:
		pod, ok := hairpinPod(k)
		return ok && hairpins.has(pod)
	case unshared(set):
		return slots[slotOfKeyID(k)]
	}
	return owners.owner(refTo(set, k)) != nil
}

// elementOrder lists a set's element ids by key, each interval's start
// before its end (keyID puts every end after every start). The kernel's
// interval sets (rbtree) take a batch's elements in that order, as the nft
// CLI sends them; with the ends last, a second interval's start arriving
// between the first's start and end made it refuse the batch (EEXIST).
func elementOrder(m map[string]Element) []string {
	ks := sortedKeys(m)
	slices.SortStableFunc(ks, func(a, b string) int {
		return cmp.Or(strings.Compare(string(keyBytes(a)), string(keyBytes(b))), cmp.Compare(a[0], b[0]))
	})
	return ks
}
