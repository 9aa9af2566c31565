package iptables

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/kpproxy/kp/proxy"
)

// Fake is an in-memory Runner for unit tests. It applies iptables-restore
// --noflush input as the kernel does, one table block at a time, each all
// or nothing: a chain line creates or flushes a user chain, -A appends, -I
// inserts, -D deletes a rule by its spec, -X deletes an existing user
// chain; at COMMIT every jump must name an existing chain and a deleted
// chain must not be jumped to. A
// refused line is a *RestoreError naming it, like the real runner's.
type Fake struct {
	Fl     Flavor
	Fam    proxy.Family
	Tables map[Table]*FakeTable
	// Inputs records every Restore input, accepted or not.
	Inputs [][]byte
	// Refuse makes any rule line containing it refused.
	Refuse string
	// RefuseCacheHint makes it an iptables that takes no list command in a
	// restore.
	RefuseCacheHint bool
	// CrashOnCacheHint makes it an iptables that dies of a signal on one.
	CrashOnCacheHint bool

	lastRestore time.Duration // how long the last Restore took (the fake's own cost)
}

// FakeTable is one table: chains in creation order, and their rules (the
// text after "-A CHAIN "), with counters.
type FakeTable struct {
	Chains   []string
	Rules    map[string][]string
	Counters map[string][]SavedRule // optional: counters per rule, set by tests
	index    map[string]bool        // Chains as a set; nil until needed
}

var builtinChains = map[Table][]string{
	TableFilter: {"INPUT", "FORWARD", "OUTPUT"},
	TableNAT:    {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
}

// NewFake returns a Fake of flavor fl and family f with empty filter and
// nat tables.
func NewFake(fl Flavor, f proxy.Family) *Fake {
	fk := &Fake{Fl: fl, Fam: f, Tables: map[Table]*FakeTable{}}
	for t, cs := range builtinChains {
		fk.Tables[t] = &FakeTable{Chains: slices.Clone(cs), Rules: map[string][]string{}}
	}
	return fk
}

func (f *Fake) Flavor() Flavor       { return f.Fl }
func (f *Fake) Family() proxy.Family { return f.Fam }

func (t *FakeTable) clone() *FakeTable {
	c := &FakeTable{Chains: slices.Clone(t.Chains), Rules: map[string][]string{}}
	for k, v := range t.Rules {
		c.Rules[k] = slices.Clone(v)
	}
	c.Counters = maps.Clone(t.Counters)
	return c
}

func (t *FakeTable) has(chain string) bool {
	if t.index == nil {
		t.index = map[string]bool{}
		for _, c := range t.Chains {
			t.index[c] = true
		}
	}
	return t.index[chain]
}

func (f *Fake) Restore(_ context.Context, data []byte) error {
	start := time.Now()
	defer func() { f.lastRestore = time.Since(start) }()
	f.Inputs = append(f.Inputs, slices.Clone(data))
	var cur *FakeTable
	var curName Table
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<16), 1<<26)
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		refuse := func(why string) error {
			return &RestoreError{Flavor: f.Fl, Family: f.Fam, Line: n, Text: line, Stderr: why}
		}
		switch {
		case line == "" || line[0] == '#':
		case line[0] == '*':
			t := f.Tables[Table(line[1:])]
			if t == nil {
				return refuse("no such table")
			}
			cur, curName = t.clone(), Table(line[1:])
		case cur == nil:
			return refuse("outside a table")
		case line == cacheHintLine:
			// a listing: changes nothing
			if f.RefuseCacheHint {
				return refuse("unknown command")
			}
			if f.CrashOnCacheHint {
				return &RestoreError{Flavor: f.Fl, Family: f.Fam, Crashed: true, Stderr: "(killed by segmentation fault)"}
			}
		case line == "COMMIT":
			if err := cur.check(); err != "" {
				return refuse(err)
			}
			f.Tables[curName] = cur
			cur = nil
		case line[0] == ':':
			name := strings.Fields(line[1:])[0]
			if !cur.has(name) {
				cur.Chains = append(cur.Chains, name)
				cur.index[name] = true
			}
			if !slices.Contains(builtinChains[curName], name) {
				delete(cur.Rules, name)
			}
		default:
			op, rest, _ := strings.Cut(line, " ")
			chain, spec, _ := strings.Cut(rest, " ")
			if !cur.has(chain) {
				return refuse("no chain " + chain)
			}
			if f.Refuse != "" && strings.Contains(line, f.Refuse) {
				return refuse("refused by the fake")
			}
			switch op {
			case "-A":
				cur.Rules[chain] = append(cur.Rules[chain], spec)
			case "-I":
				if pos, after, ok := strings.Cut(spec, " "); ok && pos == "1" {
					spec = after
				}
				cur.Rules[chain] = append([]string{spec}, cur.Rules[chain]...)
			case "-D":
				i := slices.Index(cur.Rules[chain], spec)
				if i < 0 {
					return refuse("no such rule in " + chain)
				}
				cur.Rules[chain] = slices.Delete(cur.Rules[chain], i, i+1)
			case "-X":
				if slices.Contains(builtinChains[curName], chain) || len(cur.Rules[chain]) > 0 {
					return refuse("cannot delete chain " + chain)
				}
				cur.Chains = slices.DeleteFunc(cur.Chains, func(c string) bool { return c == chain })
				delete(cur.index, chain)
			default:
				return refuse("unknown command " + op)
			}
		}
	}
	if cur != nil {
		return &RestoreError{Flavor: f.Fl, Family: f.Fam, Line: n, Stderr: "no COMMIT"}
	}
	return nil
}

// check is the kernel's check at commit: every jump and goto names an
// existing chain (upper-case targets that are not chains are extensions).
func (t *FakeTable) check() string {
	for chain, rs := range t.Rules {
		for _, r := range rs {
			if target := RuleTarget(r); strings.HasPrefix(target, "KP-") && !t.has(target) {
				return fmt.Sprintf("chain %s jumps to missing chain %s", chain, target)
			}
		}
	}
	return ""
}

// Save prints the table as iptables-save does (rule counters from
// Counters when asked for).
func (f *Fake) Save(_ context.Context, table Table, counters bool) ([]byte, error) {
	t := f.Tables[table]
	if t == nil {
		return nil, nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*%s\n", table)
	for _, c := range t.Chains {
		policy := "-"
		if slices.Contains(builtinChains[table], c) {
			policy = "ACCEPT"
		}
		fmt.Fprintf(&b, ":%s %s [0:0]\n", c, policy)
	}
	for _, c := range t.Chains {
		for i, r := range t.Rules[c] {
			if counters {
				var p, by uint64
				if cs := t.Counters[c]; i < len(cs) {
					p, by = cs[i].Packets, cs[i].Bytes
				}
				fmt.Fprintf(&b, "[%d:%d] ", p, by)
			}
			fmt.Fprintf(&b, "-A %s %s\n", c, r)
		}
	}
	b.WriteString("COMMIT\n")
	return []byte(b.String()), nil
}

// Dump lists the table's chains and their rules, one "CHAIN: rule" a
// line, chains in creation order and rules in order, for assertions.
func (f *Fake) Dump(table Table) string {
	t := f.Tables[table]
	var lines []string
	for _, c := range t.Chains {
		for _, r := range t.Rules[c] {
			lines = append(lines, c+": "+r)
		}
	}
	return strings.Join(lines, "\n")
}
