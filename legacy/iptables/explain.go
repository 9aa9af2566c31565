package iptables

import (
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"

	"github.com/kpproxy/kp/explain"
	"github.com/kpproxy/kp/proxy"
)

// RulePather is the iptables mode's explain.RulePather (both flavors): the
// first packet's path through kp's chains, hook by hook (nat PREROUTING or
// OUTPUT, filter FORWARD, INPUT or OUTPUT, nat POSTROUTING), each rule it
// matches as one step.
//
// It renders the Model's State with this package's own render and
// skeleton, the functions a sync writes the kernel with, so every chain
// name is the one kp writes, and runs the packet through those chains
// (explain_walk.go). The listing in the Model, when there is one, gives
// each step's text as iptables-save prints it and the order of the jumps
// in the built-in chains.
//
// A random endpoint choice is one step whose Verdict is "one of: jump A |
// jump B". The steps after it depend on the pick: each such step's Where
// and Verdict list one value per alternative, in the same order, joined by
// " | " ("-" where that alternative has no step there); steps every
// alternative shares are written once.
type RulePather struct{}

var _ explain.RulePather = RulePather{}

// RulePath implements explain.RulePather.
func (RulePather) RulePath(m *explain.Model, p explain.Packet, e *explain.Explanation) explain.RulePath {
	rp := explain.RulePath{Mode: m.Mode}
	fam := proxy.FamilyOf(p.Dst.Addr())
	if m.State == nil {
		rp.Absent = "the model holds no State: nothing to render"
		return rp
	}
	listed := ListedRules(m, fam)
	// The localhost NodePorts' firewall is there when the sysctl it
	// needs was set, which the snapshot tells only by the listing.
	rs := renderModel(m, fam, listed[chainKey{TableFilter, chainFirewall}] != nil)
	rs.listed = listed
	pk := newWalkPacket(m, p, e)
	rp.Steps = rs.walkAll(pk)
	if len(rp.Steps) == 0 {
		rp.Absent = "the packet matches none of kp's iptables rules"
	}
	return rp
}

// ruleSet is kp's chains of one family as a sync would write them, with
// the jumps from the built-in chains in the kernel's order.
type ruleSet struct {
	fam    proxy.Family
	chains map[chainKey]*Chain
	// builtin are the jump rules of each built-in chain, in the order
	// the kernel evaluates them.
	builtin map[chainKey][]jump
	// listed is the listing's rules: nil without a listing.
	listed Listing
}

// renderModel renders the Model's State as Sync does: each service port
// (render), the shared chains (skeleton) and the jumps.
func renderModel(m *explain.Model, fam proxy.Family, localhostNodePorts bool) *ruleSet {
	b := modelBackend(m)
	b.localhostNodePorts = localhostNodePorts
	s := m.State
	svcs := map[proxy.ServicePortName]*rendered{}
	for name, sp := range s.Services {
		svcs[name] = b.render(fam, sp, s.Endpoints[name], s.Node)
	}
	rs := &ruleSet{fam: fam, chains: map[chainKey]*Chain{}, builtin: map[chainKey][]jump{}}
	add := func(c *Chain) { rs.chains[chainKey{c.Table, c.Name}] = c }
	for _, c := range b.skeleton(fam, svcs, b.nodePortDestinations(fam, s.Node), proxy.FilterPrefixes(fam, s.ServiceCIDRs)) {
		add(c)
	}
	for _, r := range svcs {
		for _, c := range r.chains {
			add(c)
		}
	}
	// Each jump is inserted first in its chain ("-I FROM 1") in the
	// order of jumps(), so the kernel holds them in reverse.
	js := b.jumps(fam)
	for i := len(js) - 1; i >= 0; i-- {
		k := chainKey{js[i].table, js[i].from}
		rs.builtin[k] = append(rs.builtin[k], js[i])
	}
	return rs
}

// modelBackend is a Backend configured as the snapshot's kp was, as far as
// the Model tells: detect-local, masquerade-all, where NodePorts answer.
func modelBackend(m *explain.Model) *Backend {
	f := m.Facts
	cfg := proxy.Config{ClusterCIDRs: f.LocalCIDRs, MasqueradeAll: f.MasqueradeAll, MasqueradeBit: defaultMasqueradeBit}
	switch {
	case f.LocalInterface != "" && f.LocalInterfacePrefix:
		cfg.DetectLocal = proxy.DetectLocal{Mode: proxy.LocalModeInterfaceNamePrefix, InterfaceNamePrefix: f.LocalInterface}
	case f.LocalInterface != "":
		cfg.DetectLocal = proxy.DetectLocal{Mode: proxy.LocalModeBridgeInterface, BridgeInterface: f.LocalInterface}
	}
	// NodePorts answer where the snapshot says. On every address the
	// node has (upstream's iptables default), kp's rule matches any local
	// destination; else each of those addresses is a --nodeport-addresses
	// CIDR of its own, as "primary" and CIDRs render them.
	if !everyAddr(f) {
		for _, a := range f.NodePortIPs {
			cfg.NodePortAddresses = append(cfg.NodePortAddresses, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	mark, _ := cfg.MasqueradeMark()
	return &Backend{cfg: cfg, log: slog.New(slog.NewTextHandler(io.Discard, nil)), masqMark: mark,
		warnedPrimary: map[proxy.Family]bool{}, localAddrs: func() ([]netip.Addr, error) { return f.NodePortIPs, nil }}
}

// everyAddr reports whether NodePorts answer on every address of the
// node NodePorts can answer on (not loopback, link-local or multicast).
func everyAddr(f explain.Facts) bool {
	if len(f.NodePortIPs) == 0 {
		return true
	}
	for _, a := range f.LocalAddrs {
		if !a.IsLoopback() && !a.IsLinkLocalUnicast() && !a.IsMulticast() && !slices.Contains(f.NodePortIPs, a) {
			return false
		}
	}
	return true
}

// defaultMasqueradeBit is upstream's --iptables-masquerade-bit default,
// which the snapshot does not record: it changes the mark's value in a
// rule's text only, never the path.
const defaultMasqueradeBit = 14

// builtinOrder is the jumps of built-in chain k in the kernel's order: the
// listing's when it holds them, else the order a sync inserts them in.
func (rs *ruleSet) builtinOrder(k chainKey) []jump {
	js := slices.Clone(rs.builtin[k])
	specs := rs.listed[k]
	if specs == nil {
		return js
	}
	d := &Dump{Rules: map[string][]SavedRule{k.name: {}}}
	for _, s := range specs {
		d.Rules[k.name] = append(d.Rules[k.name], SavedRule{Spec: s})
	}
	at := func(j jump) int {
		found := jumpRules(d, j)
		if len(found) == 0 {
			return len(specs)
		}
		return slices.Index(specs, found[0].Spec)
	}
	slices.SortStableFunc(js, func(a, b jump) int { return at(a) - at(b) })
	return js
}

// jumpText is the jump's rule as listed, else as kp writes it.
func (rs *ruleSet) jumpText(k chainKey, j jump) string {
	if specs := rs.listed[k]; specs != nil {
		d := &Dump{Rules: map[string][]SavedRule{k.name: {}}}
		for _, s := range specs {
			d.Rules[k.name] = append(d.Rules[k.name], SavedRule{Spec: s})
		}
		if found := jumpRules(d, j); len(found) > 0 {
			return "-A " + k.name + " " + found[0].Spec
		}
	}
	return "-A " + j.from + strings.TrimPrefix(j.line(), "-I "+j.from+" 1")
}

// ruleText is rule i of chain k as listed, when the listing's rule i is
// that rule (its target and comment: iptables-save spells the matches its
// own way); else as kp writes it.
func (rs *ruleSet) ruleText(k chainKey, c *Chain, i int) string {
	r := c.Rules[i]
	if specs := rs.listed[k]; i < len(specs) {
		tgt := RuleTarget(r.Args)
		if RuleTarget(specs[i]) == tgt && strings.Contains(specs[i], r.Comment) {
			return "-A " + k.name + " " + specs[i]
		}
	}
	return r.line(k.name)
}
