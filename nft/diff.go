package nft

// diff appends to tx what turns the kernel's table (model) into want, for the
// objects in scope: a scoped object absent from want is deleted; an object in
// want that differs from the model is written. model is updated as if tx
// succeeds (the caller re-reads the kernel when it does not).
//
// Order matters within the one batch: chains and counters are created before
// rules that jump to or name them, and references (map elements, rules of
// rewritten chains) go before the chains they pointed at are deleted.
func diff(tx *Transaction, f family, model *tableState, want, scope *view) {
	for _, name := range sortedKeys(want.sets) {
		if !model.sets[name] {
			tx.addSet(f, want.sets[name])
			model.sets[name] = true
			model.elements[name] = map[string]string{}
		}
	}
	for _, name := range sortedKeys(want.counters) {
		if !model.counters[name] {
			tx.addCounter(f, name)
			model.counters[name] = true
		}
	}
	// A chain that exists is flushed and rewritten in the same batch, so
	// packets see either its old or its new rules, never none.
	var rewrite []*Chain
	for _, name := range sortedKeys(want.chains) {
		c := want.chains[name]
		d := c.digest()
		old, exists := model.chains[name]
		if exists && old == d {
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
	for _, c := range rewrite {
		for i := range c.Rules {
			tx.addRule(f, c, &c.Rules[i])
		}
	}

	for _, set := range sortedKeys(scope.elements) {
		var del []Element
		for _, k := range sortedKeys(scope.elements[set]) {
			e := scope.elements[set][k]
			if _, keep := want.elements[set][k]; keep {
				continue
			}
			// Delete only what is still ours: another service port may
			// have taken the key over since.
			if cur, ok := model.elements[set][k]; ok && cur == e.value() {
				del = append(del, e)
				delete(model.elements[set], k)
			}
		}
		tx.delElements(f, setByName(f, set), del)
	}
	for _, set := range sortedKeys(want.elements) {
		var del, add []Element
		m := model.elements[set]
		if m == nil {
			m = map[string]string{}
			model.elements[set] = m
		}
		for _, k := range sortedKeys(want.elements[set]) {
			e := want.elements[set][k]
			cur, ok := m[k]
			if ok && cur == e.value() {
				continue
			}
			if ok {
				del = append(del, e)
			}
			add = append(add, e)
			m[k] = e.value()
		}
		tx.delElements(f, setByName(f, set), del)
		tx.addElements(f, setByName(f, set), add)
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
	for _, c := range gone {
		tx.flushChain(f, c)
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

// modelView lists everything in the model as a scope, for full syncs that
// must also remove what nobody wants any more.
func modelView(m *tableState) *view {
	v := newView()
	for name := range m.chains {
		v.chains[name] = &Chain{Name: name}
	}
	for set, es := range m.elements {
		em := map[string]Element{}
		for k, val := range es {
			em[k] = Element{Key: keyBytes(k), KeyEnd: isEndKey(k), KeyText: k, Goto: val}
		}
		v.elements[set] = em
	}
	for name := range m.counters {
		v.counters[name] = true
	}
	return v
}
