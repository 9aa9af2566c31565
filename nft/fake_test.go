package nft

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
)

// Fake is an in-memory Conn for unit tests. It applies transactions all or
// nothing, with the kernel's main checks (rules go into existing chains, a
// chain still referenced cannot be deleted, elements must exist to be
// deleted and may not be added twice with another value), and exports its
// state for assertions.
type Fake struct {
	// mu orders Apply against the reads: a staged full sync applies a
	// stage while the next family's table is read (stager).
	mu     sync.Mutex
	Tables map[string]*FakeTable // by family name: "ip", "ip6"
	// Transactions counts applied transactions; LastOps is the last one's size.
	Transactions int
	LastOps      int
	// FailNext makes the next Apply fail without changing anything.
	FailNext error
	// BaseChainsAdded counts, per applied transaction, the base chains
	// it added.
	BaseChainsAdded []int
}

// FakeTable is one table's contents.
type FakeTable struct {
	Chains   map[string][]string // chain → rules in nft syntax
	Sets     map[string]*Set
	Elements map[string]map[string]Element
	Counters map[string]bool
}

// NewFake returns an empty fake ruleset.
func NewFake() *Fake { return &Fake{Tables: map[string]*FakeTable{}} }

func (ft *FakeTable) clone() *FakeTable {
	c := &FakeTable{Chains: map[string][]string{}, Sets: map[string]*Set{}, Elements: map[string]map[string]Element{}, Counters: map[string]bool{}}
	for k, v := range ft.Chains {
		c.Chains[k] = append([]string(nil), v...)
	}
	for k, v := range ft.Sets {
		c.Sets[k] = v
	}
	for k, es := range ft.Elements {
		m := map[string]Element{}
		for kk, e := range es {
			m[kk] = e
		}
		c.Elements[k] = m
	}
	for k := range ft.Counters {
		c.Counters[k] = true
	}
	return c
}

func (f *Fake) Apply(tx *Transaction) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.FailNext != nil {
		err := f.FailNext
		f.FailNext = nil
		return err
	}
	if len(tx.ops) == 0 {
		return nil
	}
	next := map[string]*FakeTable{}
	for k, t := range f.Tables {
		next[k] = t.clone()
	}
	for _, o := range tx.ops {
		if err := applyFake(next, o); err != nil {
			return fmt.Errorf("fake nftables: %w", err)
		}
	}
	for fam, t := range next {
		for chain, rules := range t.Chains {
			for _, r := range rules {
				for _, target := range ruleTargets(r) {
					if _, ok := t.Chains[target]; !ok {
						return fmt.Errorf("fake nftables: %s chain %s jumps to missing chain %s", fam, chain, target)
					}
				}
			}
		}
	}
	f.Tables = next
	f.Transactions++
	hooked := 0
	for _, o := range tx.ops {
		if o.kind == opAddChain && o.chain.Hook != nil {
			hooked++
		}
	}
	f.BaseChainsAdded = append(f.BaseChainsAdded, hooked)
	f.LastOps = len(tx.ops)
	return nil
}

func ruleTargets(rule string) []string {
	var out []string
	fields := strings.Fields(strings.NewReplacer(",", " ", "}", " ").Replace(rule))
	for i := 0; i+1 < len(fields); i++ {
		if fields[i] == "goto" || fields[i] == "jump" {
			out = append(out, fields[i+1])
		}
	}
	return out
}

func applyFake(tables map[string]*FakeTable, o op) error {
	t := tables[o.fam.name]
	if o.kind == opAddTable {
		if t == nil {
			tables[o.fam.name] = &FakeTable{Chains: map[string][]string{}, Sets: map[string]*Set{}, Elements: map[string]map[string]Element{}, Counters: map[string]bool{}}
		}
		return nil
	}
	if t == nil {
		return fmt.Errorf("table %s %s does not exist", o.fam.name, TableName)
	}
	switch o.kind {
	case opDelTable:
		delete(tables, o.fam.name)
	case opAddSet:
		if cur, ok := t.Sets[o.set.Name]; ok {
			if cur.digest() != o.set.digest() {
				return fmt.Errorf("add set %s: exists with another declaration", o.set.Name)
			}
		} else {
			t.Sets[o.set.Name] = o.set
			t.Elements[o.set.Name] = map[string]Element{}
		}
	case opDelSet:
		if _, ok := t.Sets[o.set.Name]; !ok {
			return fmt.Errorf("delete missing set %s", o.set.Name)
		}
		if refs := fakeSetRefs(t, o.set.Name); refs != "" {
			return fmt.Errorf("delete set %s: still referenced by %s", o.set.Name, refs)
		}
		delete(t.Sets, o.set.Name)
		delete(t.Elements, o.set.Name)
	case opDelCounter:
		if !t.Counters[o.name] {
			return fmt.Errorf("delete missing counter %s", o.name)
		}
		delete(t.Counters, o.name)
	case opAddChain:
		if _, ok := t.Chains[o.chain.Name]; !ok {
			t.Chains[o.chain.Name] = nil
		}
	case opFlushChain:
		if _, ok := t.Chains[o.chain.Name]; !ok {
			return fmt.Errorf("flush missing chain %s", o.chain.Name)
		}
		t.Chains[o.chain.Name] = nil
	case opDelChain:
		if _, ok := t.Chains[o.chain.Name]; !ok {
			return fmt.Errorf("delete missing chain %s", o.chain.Name)
		}
		if refs := fakeRefs(t, o.chain.Name); refs != "" {
			return fmt.Errorf("delete chain %s: still referenced by %s", o.chain.Name, refs)
		}
		delete(t.Chains, o.chain.Name)
	case opAddRule:
		if _, ok := t.Chains[o.chain.Name]; !ok {
			return fmt.Errorf("add rule to missing chain %s", o.chain.Name)
		}
		for _, set := range ruleSets(o.rule.Text) {
			if _, ok := t.Sets[set]; !ok {
				return fmt.Errorf("rule in %s names missing set %s", o.chain.Name, set)
			}
		}
		t.Chains[o.chain.Name] = append(t.Chains[o.chain.Name], o.rule.String())
	case opAddElement, opDelElement:
		es, ok := t.Elements[o.set.Name]
		if !ok {
			return fmt.Errorf("elements of missing set %s", o.set.Name)
		}
		for _, e := range o.elems {
			k := keyID(e.Key, e.KeyEnd)
			cur, exists := es[k]
			if o.kind == opDelElement {
				if !exists {
					return fmt.Errorf("delete missing element %s from %s", e.KeyText, o.set.Name)
				}
				delete(es, k)
				continue
			}
			if t.Sets[o.set.Name].Dynamic {
				return fmt.Errorf("add element %s to dynamic set %s: only packets fill it", e.KeyText, o.set.Name)
			}
			if exists && cur.value() != e.value() {
				return fmt.Errorf("add element %s to %s: exists with another value", e.KeyText, o.set.Name)
			}
			if _, ok := t.Chains[e.Chain]; e.Chain != "" && !ok {
				return fmt.Errorf("element %s of %s: %s missing chain %s", e.KeyText, o.set.Name, e.value(), e.Chain)
			}
			es[k] = e
		}
	}
	return nil
}

// ruleSets lists the named sets a rule refers to ("@name").
func ruleSets(rule string) []string {
	var out []string
	for _, f := range strings.Fields(rule) {
		if name, ok := strings.CutPrefix(f, "@"); ok {
			out = append(out, name)
		}
	}
	return out
}

func fakeSetRefs(t *FakeTable, set string) string {
	for name, rules := range t.Chains {
		for _, r := range rules {
			if slices.Contains(ruleSets(r), set) {
				return "chain " + name
			}
		}
	}
	return ""
}

func fakeRefs(t *FakeTable, chain string) string {
	for name, rules := range t.Chains {
		for _, r := range rules {
			for _, target := range ruleTargets(r) {
				if target == chain {
					return "chain " + name
				}
			}
		}
	}
	for set, es := range t.Elements {
		for _, e := range es {
			if e.Chain == chain {
				return "an element of " + set
			}
		}
	}
	return ""
}

func (f *Fake) Read(fam family) (*tableRecord, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.Tables[fam.name]
	if t == nil {
		return nil, nil
	}
	st := newTableRecord()
	for c := range t.Chains {
		st.chains[c] = 0
	}
	for s, es := range t.Elements {
		st.sets[s] = t.Sets[s].digest()
		if t.Sets[s].Dynamic {
			continue
		}
		m := map[string]uint64{}
		for k, e := range es {
			m[k] = e.digest()
		}
		st.elements[s] = m
	}
	for c := range t.Counters {
		st.counters[c] = true
	}
	return st, nil
}

// DNATCounters reads the fake's rule texts: every rule with "counter" and
// "dnat to ADDR:PORT" counts, at zero.
func (f *Fake) DNATCounters(fam family, chains []string) (map[string]map[netip.AddrPort]Counter, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]map[netip.AddrPort]Counter{}
	t := f.Tables[fam.name]
	if t == nil {
		return out, nil
	}
	for _, name := range chains {
		for _, r := range t.Chains[name] {
			_, to, ok := strings.Cut(r, "dnat to ")
			if !ok || !strings.Contains(r, "counter ") {
				continue
			}
			to, _, _ = strings.Cut(to, " ")
			ap, err := netip.ParseAddrPort(to)
			if err != nil {
				return nil, fmt.Errorf("fake: rule %q: %w", r, err)
			}
			if out[name] == nil {
				out[name] = map[netip.AddrPort]Counter{}
			}
			out[name][ap] = Counter{}
		}
	}
	return out, nil
}

// ElementCounters reports a zero counter for every element of the named
// map, when the map counts (Set.Counter).
func (f *Fake) ElementCounters(fam family, set string) (map[string]Counter, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.Tables[fam.name]
	if t == nil || t.Sets[set] == nil || !t.Sets[set].Counter {
		return nil, nil
	}
	out := map[string]Counter{}
	for k := range t.Elements[set] {
		out[k] = Counter{}
	}
	return out, nil
}

// Dump prints the fake ruleset canonically (sorted), in nft-like syntax.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var sb strings.Builder
	for _, fam := range sortedKeys(f.Tables) {
		t := f.Tables[fam]
		fmt.Fprintf(&sb, "table %s %s\n", fam, TableName)
		for _, s := range sortedKeys(t.Elements) {
			var es []string
			for _, e := range t.Elements[s] {
				v := e.value()
				if e.DataText != "" {
					v = e.DataText
				}
				if v != "" {
					es = append(es, fmt.Sprintf("%s : %s", e.KeyText, v))
				} else {
					es = append(es, e.KeyText)
				}
			}
			sort.Strings(es)
			fmt.Fprintf(&sb, "  set %s { %s }\n", s, strings.Join(es, ", "))
		}
		for _, c := range sortedKeys(t.Counters) {
			fmt.Fprintf(&sb, "  counter %s\n", c)
		}
		for _, c := range sortedKeys(t.Chains) {
			fmt.Fprintf(&sb, "  chain %s\n", c)
			for _, r := range t.Chains[c] {
				fmt.Fprintf(&sb, "    %s\n", r)
			}
		}
	}
	return sb.String()
}

// TimedElements reports no element: the kernel fills the sets with
// timeouts (affinity), not kp.
func (f *Fake) TimedElements(family, string) ([]TimedElement, error) { return nil, nil }
