package iptables

import (
	"slices"
	"strings"

	"github.com/kpproxy/kp/explain"
	"github.com/kpproxy/kp/proxy"
)

// Listing is the snapshot's iptables-save listings of one family: each
// chain's rules in order, as specs ("-A CHAIN" and counters cut off). A
// listing keeps kp's lines (ListOwned), so the built-in chains it jumps
// from are not declared in it. nil: no listing.
type Listing map[chainKey][]string

// ListedRules reads the Model's iptables-save listings of family fam.
func ListedRules(m *explain.Model, fam proxy.Family) Listing {
	var out Listing
	for _, l := range m.Rules {
		f := strings.Fields(l.Where) // "iptables-nft IPv4 nat"
		if l.Format != "iptables-save" || len(f) != 3 || f[1] != fam.String() {
			continue
		}
		table := Table("")
		for _, line := range strings.Split(l.Text, "\n") {
			line = strings.TrimSpace(line)
			switch {
			case strings.HasPrefix(line, "*"):
				table = Table(line[1:])
			case line == "" || line[0] == '#' || line[0] == ':' || line == "COMMIT" || table == "":
			default:
				r, chain, err := parseRuleLine(line)
				if err != nil {
					continue
				}
				if out == nil {
					out = Listing{}
				}
				out[chainKey{table, chain}] = append(out[chainKey{table, chain}], r.Spec)
			}
		}
	}
	return out
}

// Rules are chain's listed rules in table t, as specs.
func (l Listing) Rules(t Table, chain string) []string { return l[chainKey{t, chain}] }

// Line is rule i of chain as listed ("-A CHAIN spec"), else def.
func (l Listing) Line(t Table, chain string, i int, def string) string {
	if specs := l[chainKey{t, chain}]; i < len(specs) {
		return "-A " + chain + " " + specs[i]
	}
	return def
}

// Jumps lists, in order, the targets of the listed rules of chain in
// table t that jump (or go) to a chain under prefix.
func (l Listing) Jumps(t Table, chain, prefix string) []string {
	var out []string
	for _, s := range l[chainKey{t, chain}] {
		if to := RuleTarget(s); strings.HasPrefix(to, prefix) {
			out = append(out, to)
		}
	}
	return out
}

// JumpLine is the listed rule of chain in table t that jumps (or goes) to
// to ("-A CHAIN spec"), "" when the listing has none.
func (l Listing) JumpLine(t Table, chain, to string) string {
	for _, s := range l[chainKey{t, chain}] {
		if RuleTarget(s) == to {
			return "-A " + chain + " " + s
		}
	}
	return ""
}

// ListedOrder orders a mode's jumps of built-in chain from in table t (to
// names each one's target) as the listing holds them, when it holds any
// to a chain under prefix: the kernel's order. ok is false when it holds
// none, and mine is returned as it is.
func ListedOrder[J any](l Listing, t Table, from, prefix string, mine []J, to func(J) string) (ordered []J, ok bool) {
	listed := l.Jumps(t, from, prefix)
	if len(listed) == 0 {
		return mine, false
	}
	var out []J
	for _, name := range listed {
		if i := slices.IndexFunc(mine, func(j J) bool { return to(j) == name }); i >= 0 {
			out = append(out, mine[i])
		}
	}
	return out, true
}

// RuleStep is s as a step of kp explain's rule path, the rule's text as
// listed when the listing has it.
func (l Listing) RuleStep(s WalkStep) explain.RuleStep {
	return explain.RuleStep{Where: s.Where(), Rule: l.Line(s.Table, s.Chain, s.Index, s.Rule.Line(s.Chain)), Verdict: s.Verdict}
}
