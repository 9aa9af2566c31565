package nft

import (
	"cmp"
	"slices"
	"strings"

	"github.com/kpproxy/kp/proxy"
)

// diff appends to tx what turns the kernel's table (model) into want, for the
// objects in scope: a scoped object absent from want is deleted; an object in
// want that differs from the model is written. model is updated as if tx
// succeeds (the caller re-reads the kernel when it does not).
//
// Order matters within the one batch, which the kernel checks as it goes:
// what a rule or element names (chains, sets) exists before it;
// a set declared anew (its timeout changed) is deleted only after the rules
// naming it are flushed; references to a chain or set go before it does.
func diff(tx *Transaction, f family, model *tableState, want, scope *view) {
	var replaced []*Set
	for _, name := range sortedKeys(want.sets) {
		s := want.sets[name]
		cur, exists := model.sets[name]
		switch {
		case !exists:
			tx.addSet(f, s)
			model.elements[name] = map[string]uint64{}
		case cur != s.digest():
			replaced = append(replaced, s)
			model.elements[name] = map[string]uint64{}
		}
		model.sets[name] = s.digest()
	}
	// A chain that exists is flushed and rewritten in the same batch, so
	// packets see either its old or its new rules, never none. Chains that
	// name a replaced set are rewritten whatever their digest.
	var rewrite []*Chain
	for _, name := range sortedKeys(want.chains) {
		c := want.chains[name]
		d := c.digest()
		old, exists := model.chains[name]
		if exists && old == d && !namesAny(c, replaced) {
			continue
		}
		if exists {
			tx.flushChain(f, c)
		} else {
			tx.addChain(f, c)
		}
		rewrite = append(rewrite, c)
		model.chains[name] = d
	}
	for _, s := range replaced {
		tx.delSet(f, s)
		tx.addSet(f, s)
	}
	rules := 0
	for _, c := range rewrite {
		rules += len(c.Rules)
	}
	tx.ops = slices.Grow(tx.ops, rules) // a full sync adds 100,000s: grow once
	for _, c := range rewrite {
		for i := range c.Rules {
			tx.addRule(f, c, &c.Rules[i])
		}
	}

	for _, set := range sortedKeys(scope.elements) {
		if goneSet(set, want, scope) {
			continue // its elements go with it
		}
		var del []Element
		for _, k := range sortedKeys(scope.elements[set]) {
			e := scope.elements[set][k]
			if _, keep := want.elements[set][k]; keep {
				continue
			}
			// Whatever value it has: no service port wants the key
			// any more (want holds every key one still owns).
			if _, ok := model.elements[set][k]; ok {
				del = append(del, e)
				delete(model.elements[set], k)
			}
		}
		tx.delElements(f, setOf(f, set, want, scope), del)
	}
	for _, set := range sortedKeys(want.elements) {
		var del []Element
		add := tx.elementsFor(len(want.elements[set])) // in a full sync, nearly all of them
		m := model.elements[set]
		if m == nil {
			m = map[string]uint64{}
			model.elements[set] = m
		}
		for _, k := range elementOrder(want.elements[set]) {
			e := want.elements[set][k]
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
		s := setOf(f, set, want, scope)
		tx.delElements(f, s, del)
		tx.addElements(f, s, add)
	}

	var gone []*Chain
	for _, name := range sortedKeys(scope.chains) {
		if _, keep := want.chains[name]; keep {
			continue
		}
		if _, ok := model.chains[name]; ok {
			gone = append(gone, &Chain{Name: name})
			delete(model.chains, name)
		}
	}
	// Rules name sets and map elements name chains: flush the chains, then
	// delete the sets, then the chains.
	for _, c := range gone {
		tx.flushChain(f, c)
	}
	for _, name := range sortedKeys(scope.sets) {
		if _, ok := model.sets[name]; ok && goneSet(name, want, scope) {
			tx.delSet(f, scope.sets[name])
			delete(model.sets, name)
			delete(model.elements, name)
		}
	}
	for _, c := range gone {
		tx.delChain(f, c)
	}
	for _, name := range sortedKeys(scope.counters) {
		if want.counters[name] || !model.counters[name] {
			continue
		}
		tx.delCounter(f, name)
		delete(model.counters, name)
	}
}

func goneSet(name string, want, scope *view) bool {
	_, inScope := scope.sets[name]
	_, wanted := want.sets[name]
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

// setOf returns the declaration of the named set: from the views when one
// declares it, else kp's static one (element operations only need its name
// and key type).
func setOf(f family, name string, views ...*view) *Set {
	for _, v := range views {
		if s := v.sets[name]; s != nil && s.KeyType.Bytes != 0 {
			return s
		}
	}
	return setByName(f, name)
}

// goneFromModel lists, as a scope for diff, what the model holds that
// nobody wants: chains and sets not in wanted, elements whose key no
// service port owns (nor the skeleton, nor the hairpin counts), and any
// named counter. With an empty want, diff deletes them all, in the
// kernel's order.
func goneFromModel(m *tableState, skel *view, owned map[proxy.ServicePortName]*footprint, owners *elementOwners, hairpins *hairpins) *view {
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
	v := newView()
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
