package iptables

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/kpproxy/kp/proxy"
)

// The other modes' iptables parts (the userspace mode's redirects, the ipvs
// mode's filtering) are written through this file: chains under a prefix of
// their own, below KP-, which the iptables mode's syncs and Cleanup never
// touch (and which never collide with its KP-SVC-/KP-SEP-/… names).

// UserspaceChainPrefix starts every chain of the userspace mode's iptables
// redirects.
const UserspaceChainPrefix = "KP-USERSPACE-"

// otherOwners are the chain prefixes of the other modes that write
// iptables chains through this package (the userspace mode through
// WriteOwned, the ipvs mode its own way): the iptables mode never rewrites
// nor removes them.
var otherOwners = []string{UserspaceChainPrefix, IPVSChainPrefix}

// ownedByOther reports whether chain belongs to another mode's rules.
func ownedByOther(chain string) bool {
	for _, p := range otherOwners {
		if strings.HasPrefix(chain, p) {
			return true
		}
	}
	return false
}

// Jump is a rule of a built-in chain (From) that leads to an owned chain.
// WriteOwned inserts it first in From when missing; it is recognised in
// the kernel by its target and comment.
type Jump struct {
	Table   Table
	From    string
	To      string
	Comment string
	// Match goes before the comment ("-m conntrack --ctstate NEW").
	Match string
}

func (j Jump) internal() jump {
	return jump{table: j.Table, from: j.From, to: j.To, comment: j.Comment, extra: j.Match}
}

// OwnedRules are every chain a mode owns in one family, all named under
// Prefix, and the jumps into them from built-in chains.
type OwnedRules struct {
	Prefix string
	Chains []*Chain
	Jumps  []Jump
}

// WriteOwned makes the kernel of r (its flavor and family, in the calling
// thread's network namespace) hold exactly o, in one iptables-restore: per
// table (nat, then filter; each block atomic) it declares every chain of o
// (a chain line flushes it in the same commit, so packets see the old
// rules or the new, never an empty chain), inserts the jumps missing from
// the built-in chains, deletes jumps into o.Prefix that o does not have (or
// has twice), writes the rules, and deletes the chains under o.Prefix that
// o no longer has. It reads both tables first (iptables-save) to know what
// is there. Nothing outside o.Prefix is touched but the jumps.
func WriteOwned(ctx context.Context, r Runner, o OwnedRules) error {
	if !strings.HasPrefix(o.Prefix, ownChainPrefix) || len(o.Prefix) <= len(ownChainPrefix) {
		return fmt.Errorf("owned chain prefix %q: want one below %s", o.Prefix, ownChainPrefix)
	}
	for _, c := range o.Chains {
		if !strings.HasPrefix(c.Name, o.Prefix) {
			return fmt.Errorf("chain %s (table %s) is not under its owner's prefix %s", c.Name, c.Table, o.Prefix)
		}
	}
	var b strings.Builder
	for _, t := range []Table{TableNAT, TableFilter} {
		data, err := r.Save(ctx, t, false)
		if err != nil {
			return fmt.Errorf("read the %s table (%s): %w", t, r.Family(), err)
		}
		dumps, err := ParseSave(data)
		if err != nil {
			return fmt.Errorf("read the %s table (%s): %w", t, r.Family(), err)
		}
		d := dumps[t]
		if d == nil {
			d = &Dump{Table: t}
		}
		ownedBlock(&b, t, d, o)
	}
	if b.Len() == 0 {
		return nil
	}
	data := []byte(b.String())
	if err := r.Restore(ctx, data); err != nil {
		return fmt.Errorf("%s iptables-restore of %s chains: %w", r.Family(), o.Prefix, err)
	}
	return nil
}

// ownedBlock writes table t's block of WriteOwned's input, d being the
// table as the kernel has it; nothing when t has nothing of o's either way.
func ownedBlock(b *strings.Builder, t Table, d *Dump, o OwnedRules) {
	var chains []*Chain
	wanted := map[string]bool{}
	for _, c := range o.Chains {
		if c.Table == t {
			chains = append(chains, c)
			wanted[c.Name] = true
		}
	}
	var gone []string
	for _, name := range d.Chains {
		if strings.HasPrefix(name, o.Prefix) && !wanted[name] {
			gone = append(gone, name)
		}
	}
	// The jumps, per built-in chain: when each wanted one is there once,
	// in o's order, they stay; otherwise (missing, doubled by a hand edit
	// or a second instance, out of order) they are all deleted and
	// inserted afresh, first in the chain in o's order. Every other rule
	// of a built-in chain leading under o.Prefix is deleted by its saved
	// spec (-D deletes the first rule of that spec: copies go one by one).
	var insert []jump
	var del []string
	kept := map[string]bool{} // "FROM SPEC" of the rules kept
	var froms []string
	byFrom := map[string][]Jump{}
	for _, j := range o.Jumps {
		if j.Table == t {
			if byFrom[j.From] == nil {
				froms = append(froms, j.From)
			}
			byFrom[j.From] = append(byFrom[j.From], j)
		}
	}
	for _, from := range froms {
		js := byFrom[from]
		ok, last := true, -1
		var specs []string
		for _, j := range js {
			found := jumpRules(d, j.internal())
			if len(found) != 1 {
				ok = false
				break
			}
			i := slices.IndexFunc(d.Rules[from], func(r SavedRule) bool { return r.Spec == found[0].Spec })
			if i <= last {
				ok = false
				break
			}
			last = i
			specs = append(specs, found[0].Spec)
		}
		if ok {
			for _, sp := range specs {
				kept[from+" "+sp] = true
			}
			continue
		}
		for i := len(js) - 1; i >= 0; i-- { // each goes first: the last first
			insert = append(insert, js[i].internal())
		}
	}
	for _, chain := range d.Chains {
		if d.Policies[chain] == "" {
			continue // only built-in chains jump into an owner's
		}
		for _, r := range d.Rules[chain] {
			if strings.HasPrefix(RuleTarget(r.Spec), o.Prefix) && !kept[chain+" "+r.Spec] {
				del = append(del, "-D "+chain+" "+r.Spec)
			}
		}
	}
	if len(chains)+len(gone)+len(insert)+len(del) == 0 {
		return
	}
	b.WriteString("*" + string(t) + "\n")
	for _, c := range chains {
		b.WriteString(":" + c.Name + " - [0:0]\n")
	}
	for _, name := range gone {
		b.WriteString(":" + name + " - [0:0]\n")
	}
	for _, l := range del {
		b.WriteString(l + "\n")
	}
	for _, j := range insert {
		b.WriteString(j.line() + "\n")
	}
	for _, c := range chains {
		for _, r := range c.Rules {
			b.WriteString(r.line(c.Name) + "\n")
		}
	}
	for _, name := range gone {
		b.WriteString("-X " + name + "\n")
	}
	b.WriteString("COMMIT\n")
}

// Feature is one kernel feature a mode's rules need, as a rule that uses
// it: Spec follows "-A CHAIN " in Table.
type Feature struct {
	Name  string
	Table Table
	Spec  string
}

// ProbeFeatures is Probe for another mode's rules: it checks that the
// binaries of flavor fl and family f exist and that the kernel accepts
// every feature, in a throwaway chain deleted again. The error names the
// first feature refused, or the package to install.
func ProbeFeatures(ctx context.Context, fl Flavor, f proxy.Family, features []Feature) error {
	for _, bin := range []string{restoreBinary(fl, f), saveBinary(fl, f)} {
		if _, err := lookBinary(bin); err != nil {
			return err
		}
	}
	rules := make([]probeRule, 0, len(features))
	for _, ft := range features {
		rules = append(rules, probeRule{feature: ft.Name, table: ft.Table, spec: ft.Spec})
	}
	return probe(ctx, NewRunner(fl, f), fmt.Sprintf("KP-PROBE-%d", os.Getpid()), rules)
}

// CleanupOwned removes the chains under prefix (another mode's) and every
// rule jumping into them, in both flavors and families, as Cleanup does
// for the iptables mode's.
func CleanupOwned(ctx context.Context, log *slog.Logger, prefix string) (Removed, error) {
	if !slices.Contains(otherOwners, prefix) {
		return nil, fmt.Errorf("chain prefix %q is no mode's", prefix)
	}
	removed, err := cleanupAll(ctx, log, func(chain string) bool { return strings.HasPrefix(chain, prefix) })
	if c, r := removed.Total(); c+r > 0 || err != nil {
		log.Info("removed kp's iptables chains", "prefix", prefix, "removed", removed.String())
	}
	return removed, err
}

// DispatchEntry is one rule of an owned chain with what kp's dispatch trie
// (dispatch.go) splits on: its destination address (AddrDispatch), or
// its protocol and destination port (PortDispatch). Rules of one key keep
// Order (lower first).
type DispatchEntry struct {
	Addr  netip.Addr
	Proto string // "tcp", "udp", "sctp"
	Port  int32
	Order int
	Rule  Rule
}

// AddrDispatch splits es into kp's address trie, as the iptables mode's
// KP-SERVICES: the rules for the chain itself and the trie's chains, named
// prefix-BITS-HEX (prefix at most 16 characters).
func AddrDispatch(table Table, fam proxy.Family, prefix string, es []DispatchEntry) ([]Rule, []*Chain) {
	in := make([]entry, len(es))
	for i, e := range es {
		in[i] = entry{key: addrKey(e.Addr), order: e.Order, rule: e.Rule}
	}
	return addrTree(table, fam, prefix, in)
}

// PortDispatch splits es by protocol, then port, as the iptables mode's
// KP-NODEPORTS.
func PortDispatch(table Table, fam proxy.Family, prefix string, es []DispatchEntry) ([]Rule, []*Chain) {
	in := make([]entry, len(es))
	for i, e := range es {
		in[i] = entry{key: uint32(e.Port), proto: e.Proto, order: e.Order, rule: e.Rule}
	}
	return portTree(table, fam, prefix, in)
}
