package nft

import (
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"

	"github.com/kpproxy/kp/explain"
	"github.com/kpproxy/kp/proxy"
)

// RulePather tells a packet's path through the nftables mode's rules
// (explain.RulePather). It renders the Model's State into the objects a
// full sync writes, with the sync's own constructors (skeleton,
// renderInto), and walks the packet through them expression by expression
// (explain_walk.go): a chain name, a rule or a verdict cannot drift from
// what kp writes. Rule text and handles come from the snapshot's `nft -a
// list table` when it has one. Where the kernel picks at random (an
// endpoint slot, an affinity rule), every alternative is walked: the step
// that differs says "one of: ...", and the steps after it list each
// alternative's (explain.BranchSteps).
type RulePather struct{}

// maxAlternatives bounds the random alternatives walked (a Service's
// endpoints, at most).
const maxAlternatives = 4096

func (RulePather) RulePath(m *explain.Model, p explain.Packet, e *explain.Explanation) explain.RulePath {
	rp := explain.RulePath{Mode: string(proxy.ModeNFTables)}
	f := familyIPv4
	if p.Dst.Addr().Is6() {
		f = familyIPv6
	}
	v, err := desiredTable(m, f)
	if err != nil {
		rp.Absent = "the path through kp's nftables rules could not be rendered: " + err.Error()
		return rp
	}
	var notes []string
	src, iif, note := walkSource(m, p, e, f)
	if note != "" {
		notes = append(notes, note)
	}
	pinAffinity(m, e, v, src)
	fromNode := e.Source.Node
	local := func(a netip.Addr) bool { return a.IsLoopback() || slices.Contains(m.Facts.LocalAddrs, a) }
	proto := proxy.ProtocolNumber(p.Protocol)
	srcPort := p.SrcPort
	if srcPort == 0 {
		srcPort = 40000
	}
	walks, truncated, err := walkAll(func() *walker {
		return &walker{v: v, f: f, local: local,
			pkt: newWalkPacket(f, netip.AddrPortFrom(src, srcPort), p.Dst, proto, iif)}
	}, fromNode)
	if err != nil {
		rp.Absent = "the path through kp's nftables rules could not be walked: " + err.Error()
		return rp
	}
	if truncated {
		notes = append(notes, fmt.Sprintf("only the first %d random choices are walked", maxAlternatives))
	}
	listed, listNote := listedChains(m, f)
	if listNote != "" {
		notes = append(notes, listNote)
	}
	alts := make([][]explain.RuleStep, len(walks))
	mismatched := map[string]bool{}
	for i, w := range walks {
		for _, s := range w.steps {
			alts[i] = append(alts[i], resolveStep(f, v, listed, s, mismatched))
		}
		if got := walkVerdict(w.outcome); got != e.Verdict {
			notes = append(notes, fmt.Sprintf("kp's rules, walked, give %s where its model says %s: kp explain disagrees "+
				"with itself, please report it", got, e.Verdict))
			break
		}
	}
	if len(mismatched) > 0 {
		notes = append(notes, fmt.Sprintf("the listing's %s differ from what kp writes for this model (listed at another sync?): "+
			"their rules are shown as kp renders them, without handles", "chain "+strings.Join(sortedKeys(mismatched), ", chain ")))
	}
	rp.Steps = mergeAlternatives(alts)
	rp.Note = strings.Join(notes, "; ")
	return rp
}

func walkVerdict(outcome string) explain.Verdict {
	switch outcome {
	case "dnat":
		return explain.VerdictDNAT
	case "reject":
		return explain.VerdictReject
	case "drop":
		return explain.VerdictDrop
	}
	return explain.VerdictNotKPs
}

// desiredTable is family f's table as a full sync renders m's State: the
// skeleton, then every service port in name order, a shared element
// going to the first port that renders it (elementOwners), and the
// hairpin element of every endpoint's pod. The endpoint slots are this
// rendering's own: which slot an endpoint has in the kernel depends on the
// syncs before, and no path does.
func desiredTable(m *explain.Model, f family) (*objects, error) {
	b, err := newBackend(modelConfig(m), slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		return nil, err
	}
	s := m.State
	npIPs := m.Facts.NodePortIPs
	if len(npIPs) == 0 {
		npIPs = s.Node.IPs
	}
	v := b.skeleton(f, proxy.FilterAddrs(f.pf, npIPs), proxy.FilterPrefixes(f.pf, b.cfg.LocalCIDRs()),
		proxy.FilterPrefixes(f.pf, s.ServiceCIDRs))
	names := make([]proxy.ServicePortName, 0, len(s.Services))
	for name := range s.Services {
		names = append(names, name)
	}
	slices.SortFunc(names, compareNames)
	slots, one := newSlotTable(), newObjects()
	for _, name := range names {
		b.renderInto(one, f, slots, s.Services[name], s.Endpoints[name], s.Node)
		v.mergeWithoutElements(one)
		for set, es := range one.elements {
			for k, e := range es {
				if _, taken := v.elementMap(set)[k]; !taken || unshared(set) {
					v.putElement(set, k, e)
				}
			}
		}
		for _, a := range one.pods {
			v.addElement(setHairpin, hairpinElement(a))
		}
	}
	return v, nil
}

// modelConfig is the part of kp's Config the rules depend on, from the
// Model's facts. The masquerade mark is the default bit's: the path does
// not depend on it, and a listing shows the real one.
func modelConfig(m *explain.Model) proxy.Config {
	cfg := proxy.Config{ClusterCIDRs: m.Facts.LocalCIDRs, MasqueradeAll: m.Facts.MasqueradeAll, MasqueradeBit: 14}
	switch {
	case m.Facts.LocalInterface != "" && m.Facts.LocalInterfacePrefix:
		cfg.DetectLocal = proxy.DetectLocal{Mode: proxy.LocalModeInterfaceNamePrefix, InterfaceNamePrefix: m.Facts.LocalInterface}
	case m.Facts.LocalInterface != "":
		cfg.DetectLocal = proxy.DetectLocal{Mode: proxy.LocalModeBridgeInterface, BridgeInterface: m.Facts.LocalInterface}
	}
	return cfg
}

// walkSource is the packet's source address and input interface: --from,
// or, without it, an address of the kind of client the explanation
// assumed (a pod's, in the local CIDR; an outside client's, inside the
// LoadBalancer's source ranges when it has any). In the interface
// detect-local modes only a packet the explanation calls a pod's comes in
// on the pods' interface.
func walkSource(m *explain.Model, p explain.Packet, e *explain.Explanation, f family) (netip.Addr, string, string) {
	pod := e.Source.Pod != nil && *e.Source.Pod
	iif, note := "", ""
	if name := m.Facts.LocalInterface; name != "" {
		switch {
		case pod && m.Facts.LocalInterfacePrefix:
			iif = name + "0"
		case pod:
			iif = name
		case e.Source.Pod == nil && !e.Source.Node:
			note = "kp tells pods' traffic by its interface: the path shown is for a packet that does not arrive on " + name
		}
	}
	if p.Src.IsValid() {
		return p.Src, iif, note
	}
	local := func(a netip.Addr) bool {
		return slices.Contains(m.Facts.LocalAddrs, a) ||
			slices.ContainsFunc(m.Facts.LocalCIDRs, func(c netip.Prefix) bool { return c.Contains(a) })
	}
	var src netip.Addr
	switch cidrs := proxy.FilterPrefixes(f.pf, m.Facts.LocalCIDRs); {
	case pod && len(cidrs) > 0:
		src = firstFree(cidrs[0], func(a netip.Addr) bool { return slices.Contains(m.Facts.LocalAddrs, a) })
	case e.Firewall != nil && len(e.Firewall.Ranges) > 0:
		if r, err := netip.ParsePrefix(e.Firewall.Ranges[0]); err == nil {
			src = firstFree(r, local)
		}
	}
	if !src.IsValid() {
		src = netip.MustParseAddr("203.0.113.1")
		if f.v6 {
			src = netip.MustParseAddr("2001:db8::1")
		}
	}
	what := "a client outside the cluster"
	if pod {
		what = "a pod"
	}
	return src, iif, joinNotes(note, fmt.Sprintf("no --from: the path is for a packet from %s (%s)", src, what))
}

// firstFree is the first address of p (after its network address) that
// taken does not refuse, or none.
func firstFree(p netip.Prefix, taken func(netip.Addr) bool) netip.Addr {
	a := p.Masked().Addr().Next()
	for i := 0; i < 16 && a.IsValid() && p.Contains(a); i, a = i+1, a.Next() {
		if !taken(a) {
			return a
		}
	}
	return netip.Addr{}
}

func joinNotes(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// pinAffinity puts the client in the affinity set of the endpoint the
// explanation says it is pinned to.
func pinAffinity(m *explain.Model, e *explain.Explanation, v *objects, src netip.Addr) {
	if e.Affinity == nil || e.Affinity.PinnedTo == "" || e.Service == nil {
		return
	}
	pinned, err := netip.ParseAddrPort(strings.Fields(e.Affinity.PinnedTo)[0])
	if err != nil {
		return
	}
	for name, sp := range m.State.Services {
		if name.Namespace != e.Service.Namespace || name.Name != e.Service.Name || name.Port != e.Service.PortName ||
			string(name.Protocol) != e.Service.Protocol {
			continue
		}
		for _, ep := range m.State.Endpoints[name] {
			if ep.AddrPort() == pinned {
				v.addElement(affinitySetName(sp, ep), Element{Key: addrKey(src), KeyText: src.String()})
			}
		}
	}
}

// walkAll walks every random alternative: a walk that made more choices
// than it was given is walked again for each alternative of the next one.
func walkAll(newWalker func() *walker, fromNode bool) (walks []*walker, truncated bool, err error) {
	var rec func(choices []uint32) error
	rec = func(choices []uint32) error {
		if len(walks) >= maxAlternatives {
			truncated = true
			return nil
		}
		w := newWalker()
		w.choices = choices
		w.run(fromNode)
		if w.err != nil {
			return w.err
		}
		if len(w.widths) == len(choices) {
			walks = append(walks, w)
			return nil
		}
		for c := range w.widths[len(choices)] {
			if err := rec(append(slices.Clone(choices), c)); err != nil {
				return err
			}
		}
		return nil
	}
	return walks, truncated, rec(nil)
}

// mergeAlternatives makes one path of the random alternatives' paths: the
// steps they all take up to the first random choice, that choice as one
// step whose Verdict is "one of: a | b" (the same chain, another verdict),
// then the steps after it by branch (explain.BranchSteps): a shared pick
// goes to each slot's chain, a pick of the client itself meets the
// hairpin rule, a pick of a node address goes to input.
func mergeAlternatives(alts [][]explain.RuleStep) []explain.RuleStep {
	if len(alts) == 0 {
		return nil
	}
	first := alts[0]
	for i := range first {
		same, sameChain := true, true
		for _, a := range alts {
			if i >= len(a) || a[i].Where != first[i].Where {
				sameChain = false
			} else if a[i] != first[i] {
				same = false
			}
		}
		if same && sameChain {
			continue
		}
		steps := slices.Clone(first[:i])
		at := i
		if sameChain {
			steps, at = append(steps, mergeStep(alts, i)), i+1
		}
		tails := make([][]explain.RuleStep, len(alts))
		for k, a := range alts {
			tails[k] = a[min(at, len(a)):]
		}
		return append(steps, explain.BranchSteps(tails)...)
	}
	return first
}

// mergeStep is the alternatives' i-th steps, of one chain, as one step:
// their rules, elements and verdicts ("one of: a | b").
func mergeStep(alts [][]explain.RuleStep, i int) explain.RuleStep {
	s := alts[0][i]
	var rules, verdicts, elements []string
	for _, a := range alts {
		rules, verdicts, elements = addUnique(rules, a[i].Rule), addUnique(verdicts, a[i].Verdict), addUnique(elements, a[i].Element)
		if a[i].Handle != s.Handle {
			s.Handle = 0
		}
	}
	s.Rule, s.Element = strings.Join(rules, " | "), strings.Join(elements, " | ")
	if len(verdicts) > 1 {
		s.Verdict = "one of: " + strings.Join(verdicts, " | ")
	}
	return s
}

func addUnique(list []string, s string) []string {
	if s == "" || slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}
