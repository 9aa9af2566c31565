package userspace

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/explain"
	"github.com/kpproxy/kp/legacy/iptables"
	"github.com/kpproxy/kp/proxy"
)

// RulePather is the userspace mode's explain.RulePather: the first
// packet's path through the redirect rules (the kp-userspace table, or
// the KP-USERSPACE- chains when the snapshot's listing is iptables'),
// hook by hook, then the listener the redirect leads to. The rules are the
// backend's own rendering of the model (renderRules, and renderIPTables
// for the chains); the listing gives the listener ports, the rules' text
// and (nftables) handles.
type RulePather struct{}

// RulePath implements explain.RulePather.
func (RulePather) RulePath(m *explain.Model, p explain.Packet, e *explain.Explanation) explain.RulePath {
	w := newUserspaceWalk(m, p, e)
	if w.iptables {
		w.runIPTables()
	} else {
		w.runNFT()
	}
	rp := explain.RulePath{Mode: m.Mode, Steps: w.steps}
	if len(rp.Steps) == 0 {
		rp.Absent = "the packet matches no rule of kp's userspace mode"
	}
	return rp
}

// ListenerWhere names a listener as a RuleStep's Where: the listeners
// bind every address of the node, so the port (and protocol) is what
// names one: "userspace listener TCP *:39017".
func ListenerWhere(proto v1.Protocol, port int) string {
	p := "?"
	if port != 0 {
		p = strconv.Itoa(port)
	}
	return fmt.Sprintf("userspace listener %s *:%s", proto, p)
}

type userspaceWalk struct {
	m        *explain.Model
	e        *explain.Explanation
	fam      proxy.Family
	rules    Rules
	iptables bool
	// nft: each chain's listed rule lines in order (nft -a list).
	nftRules map[string][]string
	// iptables: each chain's listed rules (iptables-save).
	listed iptables.Listing

	src, dst netip.Addr
	proto    v1.Protocol
	dport    uint16
	srcLocal bool
	dstLocal bool
	local    map[netip.Addr]bool
	// redirected is the listener port a redirect sent the packet to.
	redirected    int
	wasRedirected bool
	steps         []explain.RuleStep
	stopped       bool
}

// listenerLine is a line of the listeners' listing (listenerLines).
var listenerLine = regexp.MustCompile(`^(\S+)( external)? (TCP|UDP|SCTP) \S*:(\d+)`)

func newUserspaceWalk(m *explain.Model, p explain.Packet, e *explain.Explanation) *userspaceWalk {
	fam := proxy.FamilyOf(p.Dst.Addr())
	w := &userspaceWalk{m: m, e: e, fam: fam, nftRules: map[string][]string{}, listed: iptables.ListedRules(m, fam),
		dst: p.Dst.Addr(), src: p.Src, proto: p.Protocol, dport: p.Dst.Port(), srcLocal: e.Source.Node, local: map[netip.Addr]bool{}}
	ports := map[string]int{} // "ns/name:port" and "... external" → listener port
	for _, l := range m.Rules {
		switch {
		case l.Format == ListingFormatListeners:
			for _, line := range strings.Split(l.Text, "\n") {
				if g := listenerLine.FindStringSubmatch(line); g != nil {
					n, _ := strconv.Atoi(g[4])
					ports[g[1]+g[2]] = n
				}
			}
		case l.Format == "nft" && l.Where == "nftables "+familyName(fam)+" "+TableName:
			w.nftRules = nftListedRules(l.Text)
		case l.Format == "iptables-save" && strings.Contains(l.Where, " "+fam.String()+" "):
			w.iptables = true
		}
	}
	if len(m.Rules) == 0 && m.IPTablesBackend != "" {
		w.iptables = true // no listing: the flavor the snapshot reports
	}
	for _, a := range m.Facts.LocalAddrs {
		w.local[a] = true
	}
	w.dstLocal = w.local[w.dst]
	st := m.State
	states := map[proxy.ServicePortName]portState{}
	for name, sp := range st.Services {
		usable, dropInternal := rulesUse(sp, st.Endpoints[name], st.Node)
		lp := listenerPorts{internal: ports[name.String()], external: ports[name.String()+" external"]}
		// A port without a listed listener still gets its rules: 0 is
		// "a listener port the snapshot does not tell".
		states[name] = portState{ports: lp, usable: usable, dropInternal: dropInternal, sp: sp}
	}
	w.rules = renderRules(fam, st, states, nodePortPrefixes(m, fam))
	return w
}

// nodePortPrefixes is where NodePorts answer, as the backend's
// nodePortAddrs gives them: the snapshot's NodePort addresses.
func nodePortPrefixes(m *explain.Model, fam proxy.Family) []netip.Prefix {
	var out []netip.Prefix
	for _, a := range proxy.FilterAddrs(fam, m.Facts.NodePortIPs) {
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	if len(out) == 0 {
		return []netip.Prefix{{}}
	}
	return out
}

// nftListedRules reads `nft -a list table` into each chain's rule lines.
func nftListedRules(text string) map[string][]string {
	out := map[string][]string{}
	chain := ""
	for _, line := range strings.Split(text, "\n") {
		l := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(l, "chain "):
			chain = strings.Fields(l)[1]
		case l == "}":
			chain = ""
		case chain != "" && strings.Contains(l, "# handle ") && !strings.HasPrefix(l, "type "):
			out[chain] = append(out[chain], l)
		}
	}
	return out
}

// matches reports whether the packet (as it is now) matches r.
func (w *userspaceWalk) matches(r Redirect) bool {
	if r.NodePort {
		if !w.dstLocal || r.NodePortAddrs.IsValid() && !r.NodePortAddrs.Contains(w.dst) {
			return false
		}
	} else if r.Addr != w.dst {
		return false
	}
	if r.Protocol != "" && (r.Protocol != w.proto || int(w.dport) != int(r.Port)) {
		return false
	}
	if len(r.SourceRanges) > 0 {
		return w.src.IsValid() && slices.ContainsFunc(r.SourceRanges, func(p netip.Prefix) bool { return p.Contains(w.src) })
	}
	return true
}

// listenerStep is where a redirected packet ends: the listener, which
// connects to one of the endpoints explain chose.
func (w *userspaceWalk) listenerStep() {
	step := explain.RuleStep{Where: ListenerWhere(w.proto, w.redirected), Rule: "listener of " + w.e.Packet}
	if s := w.e.Service; s != nil {
		step.Rule = fmt.Sprintf("listener of %s/%s:%s (%s %d)", s.Namespace, s.Name, s.PortName, s.Protocol, s.Port)
	}
	var alts []string
	for _, ep := range w.e.Endpoints {
		if ep.Eligible {
			alts = append(alts, "to "+ep.Address)
		}
	}
	if a := w.e.Affinity; a != nil && a.PinnedTo != "" {
		alts = []string{"to " + a.PinnedTo}
	}
	switch len(alts) {
	case 0:
		step.Verdict = "reject"
	case 1:
		step.Verdict = alts[0]
	default:
		step.Verdict = "one of: " + strings.Join(alts, " | ")
	}
	w.steps = append(w.steps, step)
}

// runNFT walks the kp-userspace table's chains: nat (prerouting for a
// packet arriving, output for the node's own), then filter (input for a
// local destination, a redirected packet's above all; forward; output),
// then the listener.
func (w *userspaceWalk) runNFT() {
	nat, filter := "prerouting", "filter-forward"
	if w.srcLocal {
		nat, filter = "output", "filter-output"
	}
	w.nftNAT(nat)
	if w.stopped {
		return
	}
	if w.dstLocal {
		filter = "filter-input"
	}
	if w.srcLocal && w.dstLocal {
		// The node's own packet to a local address passes output, then
		// input (on lo).
		w.nftFilter("filter-output")
		if w.stopped {
			return
		}
	}
	w.nftFilter(filter)
	if !w.stopped && w.wasRedirected {
		w.listenerStep()
	}
}

// nftNAT walks a nat chain as natRules writes it: the rules of their own
// (source ranges' redirects and drops), the service ports' map, the
// NodePorts' map per prefix.
func (w *userspaceWalk) nftNAT(chain string) {
	plan := planElements(w.rules)
	i := 0
	for _, r := range w.rules.Redirects {
		switch {
		case r.Verdict == VerdictDrop:
			if w.matches(r) {
				w.nftStep(chain, i, "", "drop")
				w.stopped = true
				return
			}
			i++
		case len(r.SourceRanges) > 0:
			for _, src := range r.SourceRanges {
				if w.matches(Redirect{Addr: r.Addr, NodePort: r.NodePort, NodePortAddrs: r.NodePortAddrs, Protocol: r.Protocol, Port: r.Port,
					SourceRanges: []netip.Prefix{src}}) {
					w.nftStep(chain, i, "", redirectVerdict(r.ToPort))
					w.redirectTo(r.ToPort)
					return
				}
				i++
			}
		}
	}
	for _, r := range w.rules.Redirects {
		if !ownRule(r) && !r.NodePort && w.matches(r) {
			w.nftStep(chain, i, fmt.Sprintf("%s . %s . %d : %s", r.Addr, protoLower(r.Protocol), r.Port, portText(r.ToPort)), redirectVerdict(r.ToPort))
			w.redirectTo(r.ToPort)
			return
		}
	}
	i++
	for _, p := range plan.npRedirect {
		for _, r := range w.rules.Redirects {
			if !ownRule(r) && r.NodePort && r.NodePortAddrs == p && w.matches(r) {
				w.nftStep(chain, i, fmt.Sprintf("%s . %d : %s", protoLower(r.Protocol), r.Port, portText(r.ToPort)), redirectVerdict(r.ToPort))
				w.redirectTo(r.ToPort)
				return
			}
		}
		i++
	}
}

// nftFilter walks a filter chain as filterRules and listenerRules write
// it, for a connection's first packet.
func (w *userspaceWalk) nftFilter(chain string) {
	plan := planElements(w.rules)
	i := 0
	reject := func(elem string) {
		w.nftStep(chain, i, elem, "reject")
		w.stopped = true
	}
	for _, tcp := range []bool{true, false} {
		isTCP := w.proto == v1.ProtocolTCP
		for _, r := range w.rules.Rejects {
			if isTCP == tcp && r.Protocol != "" && !r.NodePort && w.matches(r) {
				reject(fmt.Sprintf("%s . %s . %d", r.Addr, protoLower(r.Protocol), r.Port))
				return
			}
		}
		i++
		for _, p := range plan.npReject {
			for _, r := range w.rules.Rejects {
				if isTCP == tcp && r.NodePort && r.NodePortAddrs == p && w.matches(r) {
					reject(fmt.Sprintf("%s . %d", protoLower(r.Protocol), r.Port))
					return
				}
			}
			i++
		}
	}
	for _, r := range w.rules.Rejects {
		if r.Protocol == "" && r.Addr == w.dst {
			reject(r.Addr.String())
			return
		}
	}
	i++
	if chain != "filter-input" {
		for _, p := range w.rules.Drops {
			if p.Contains(w.dst) {
				w.nftStep(chain, i, "", "drop")
				w.stopped = true
				return
			}
			i++
		}
		return
	}
	if w.wasRedirected {
		return // the listeners' rule refuses only what nat did not redirect
	}
	for _, proto := range []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP} {
		for _, l := range w.rules.Listeners {
			if proto == w.proto && l.Protocol == proto && l.Port == int(w.dport) {
				reject(fmt.Sprintf("%s . %d", protoLower(proto), l.Port))
				return
			}
		}
		i++
	}
}

func (w *userspaceWalk) redirectTo(port int) {
	// REDIRECT's new destination is the address of the interface the
	// packet came in on: local, and no Service's.
	w.wasRedirected, w.redirected, w.dstLocal = true, port, true
	w.dst, w.dport = netip.Addr{}, uint16(port)
}

func redirectVerdict(port int) string { return "redirect to :" + portText(port) }

func portText(port int) string {
	if port == 0 {
		return "?"
	}
	return strconv.Itoa(port)
}

func protoLower(p v1.Protocol) string { return strings.ToLower(string(p)) }

// nftStep records the i-th rule of chain: its listed text and handle
// when the listing has it.
func (w *userspaceWalk) nftStep(chain string, i int, elem, verdict string) {
	s := explain.RuleStep{Where: familyName(w.fam) + " " + TableName + " " + chain, Element: elem, Verdict: verdict}
	if l := w.nftRules[chain]; i < len(l) {
		text, handle, _ := strings.Cut(l[i], " # handle ")
		s.Rule = text
		s.Handle, _ = strconv.ParseUint(strings.TrimSpace(handle), 10, 64)
	} else {
		s.Rule = fmt.Sprintf("rule %d of %s", i+1, chain)
	}
	w.steps = append(w.steps, s)
}

// runIPTables walks the KP-USERSPACE- chains renderIPTables writes, from
// the built-in chains' jumps (ipJumps) hook by hook, then the listener.
func (w *userspaceWalk) runIPTables() {
	owned := renderIPTables(w.fam, w.rules)
	chains := iptables.ChainIndex(owned.Chains)
	src := w.src
	if !src.IsValid() {
		src = netip.IPv4Unspecified()
		if w.fam == proxy.IPv6 {
			src = netip.IPv6Unspecified()
		}
	}
	pkt := &iptables.WalkPacket{Src: src, Dst: w.dst, Proto: protoLower(w.proto), DPort: w.dport, SrcLocal: w.srcLocal,
		DstLocal: w.dstLocal, CtStates: []string{"NEW"}}
	hook := func(t iptables.Table, from string) {
		if w.stopped {
			return
		}
		var js []iptables.HookJump
		for _, j := range w.builtinJumps(owned.Jumps, t, from) {
			js = append(js, iptables.HookJump{Match: j.Match, To: j.To, Rule: w.jumpText(t, from, j)})
		}
		v := w.listed.WalkHook(chains, t, from, js, pkt, func(s explain.RuleStep) {
			w.steps = append(w.steps, s)
			if strings.HasPrefix(s.Verdict, "redirect to :") {
				w.redirectTo(int(pkt.DPort)) // Walk redirected pkt
			}
		})
		w.stopped = v == iptables.WalkDrop || v == iptables.WalkReject
	}
	if w.srcLocal {
		hook(iptables.TableNAT, "OUTPUT")
		hook(iptables.TableFilter, "OUTPUT")
		if w.dstLocal {
			hook(iptables.TableFilter, "INPUT")
		}
	} else {
		hook(iptables.TableNAT, "PREROUTING")
		if w.dstLocal {
			hook(iptables.TableFilter, "INPUT")
		} else {
			hook(iptables.TableFilter, "FORWARD")
		}
	}
	if !w.stopped && w.wasRedirected {
		w.listenerStep()
	}
}

// builtinJumps are kp's jumps of a built-in chain in the kernel's order:
// as listed, else as WriteOwned keeps them (in ipJumps' order).
func (w *userspaceWalk) builtinJumps(all []iptables.Jump, t iptables.Table, from string) []iptables.Jump {
	var mine []iptables.Jump
	for _, j := range all {
		if j.Table == t && j.From == from {
			mine = append(mine, j)
		}
	}
	out, _ := iptables.ListedOrder(w.listed, t, from, iptables.UserspaceChainPrefix, mine, func(j iptables.Jump) string { return j.To })
	return out
}

func (w *userspaceWalk) jumpText(t iptables.Table, from string, j iptables.Jump) string {
	if l := w.listed.JumpLine(t, from, j.To); l != "" {
		return l
	}
	return strings.TrimSpace(fmt.Sprintf("-A %s %s -m comment --comment %q -j %s", from, j.Match, j.Comment, j.To))
}
