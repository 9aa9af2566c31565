package ipvs

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/explain"
	"github.com/kpproxy/kp/legacy/iptables"
	"github.com/kpproxy/kp/proxy"
)

// RulePather is the ipvs mode's explain.RulePather: the first packet's
// path through the KP-IPVS- chains, hook by hook as the kernel runs them,
// with the IPVS virtual server where IPVS takes the packet (the INPUT
// hook, after the filter table; the OUTPUT hook for the node's own). The
// chains, sets and virtual servers are the backend's own rendering of the
// model (renderChains, render), never a second formula; the listing, when
// the snapshot has it, gives the rules' text, the built-in chains' order
// and the masquerade mark.
type RulePather struct{}

// defaultMasqMark is the mark of kp's default --masquerade-bit (14), for a
// snapshot without the listing that would tell it.
const defaultMasqMark = 1 << 14

// RulePath implements explain.RulePather.
func (RulePather) RulePath(m *explain.Model, p explain.Packet, e *explain.Explanation) explain.RulePath {
	w := newPathWalk(m, p, e)
	w.run()
	rp := explain.RulePath{Mode: m.Mode, Steps: w.steps}
	if len(rp.Steps) == 0 {
		rp.Absent = "the packet matches no rule of kp's ipvs mode"
	}
	return rp
}

// pathWalk is one packet's walk through the ipvs mode's hooks.
type pathWalk struct {
	m      *explain.Model
	e      *explain.Explanation
	fam    proxy.Family
	chains iptables.Chains
	// listed are the snapshot's iptables-save listings.
	listed  iptables.Listing
	servers map[vsKey]*VirtualServer
	sets    map[string][]string
	local   map[netip.Addr]bool
	ipvsTxt string
	pkt     *iptables.WalkPacket
	steps   []explain.RuleStep
	stopped bool
}

func newPathWalk(m *explain.Model, p explain.Packet, e *explain.Explanation) *pathWalk {
	fam := proxy.FamilyOf(p.Dst.Addr())
	w := &pathWalk{m: m, e: e, fam: fam, listed: iptables.ListedRules(m, fam), servers: map[vsKey]*VirtualServer{},
		sets: map[string][]string{}, local: map[netip.Addr]bool{}}
	for _, l := range m.Rules {
		if l.Format == ListingFormatIPVS {
			w.ipvsTxt = l.Text
		}
	}
	st := m.State
	nodeAddrs := proxy.FilterAddrs(fam, m.Facts.NodePortIPs)
	if len(nodeAddrs) == 0 {
		nodeAddrs = proxy.FilterAddrs(fam, st.Node.IPs)
	}
	in := renderInput{family: fam, scheduler: w.scheduler(), node: st.Node, nodeAddrs: nodeAddrs}
	for name, sp := range st.Services {
		r := render(in, sp, st.Endpoints[name])
		for _, vs := range r.servers {
			w.servers[vs.Key] = vs
		}
		for _, a := range r.addrs {
			w.local[a] = true
		}
		for _, se := range r.entries {
			n := setName(fam, se.Kind)
			w.sets[n] = append(w.sets[n], se.Entry)
		}
	}
	for _, a := range m.Facts.LocalAddrs {
		w.local[a] = true
	}
	w.chains = iptables.ChainIndex(renderChains(rulesInput{family: fam, masqMark: w.masqMark(), masqueradeAll: m.Facts.MasqueradeAll,
		notLocal: notLocal(m.Facts, fam), serviceCIDRs: st.ServiceCIDRs}))
	src := p.Src
	pod := e.Source.Pod != nil && *e.Source.Pod
	if !src.IsValid() {
		// No --from: a source of the kind explain assumed (a pod's when
		// it assumed a pod), so the detect-local matches answer as it did.
		if pod && len(proxy.FilterPrefixes(fam, m.Facts.LocalCIDRs)) > 0 {
			src = proxy.FilterPrefixes(fam, m.Facts.LocalCIDRs)[0].Addr().Next()
		} else if fam == proxy.IPv4 {
			src = netip.IPv4Unspecified()
		} else {
			src = netip.IPv6Unspecified()
		}
	}
	w.pkt = &iptables.WalkPacket{Src: src, Dst: p.Dst.Addr(), Proto: strings.ToLower(string(p.Protocol)), SPort: p.SrcPort,
		DPort: p.Dst.Port(), SrcLocal: e.Source.Node, DstLocal: w.local[p.Dst.Addr()], InLocal: pod, CtStates: []string{"NEW"}}
	w.pkt.InSet = w.inSet
	return w
}

// notLocal is iptables.LocalMatch of the snapshot's detect-local facts.
func notLocal(f explain.Facts, fam proxy.Family) string {
	cfg := proxy.Config{ClusterCIDRs: f.LocalCIDRs}
	if f.LocalInterface != "" {
		cfg.DetectLocal.Mode = proxy.LocalModeBridgeInterface
		cfg.DetectLocal.BridgeInterface = f.LocalInterface
		if f.LocalInterfacePrefix {
			cfg.DetectLocal = proxy.DetectLocal{Mode: proxy.LocalModeInterfaceNamePrefix, InterfaceNamePrefix: f.LocalInterface}
		}
	}
	m, _ := iptables.LocalMatch(cfg, fam, true)
	return m
}

// scheduler is the virtual servers' scheduler as listed, else rr.
func (w *pathWalk) scheduler() string {
	for _, line := range strings.Split(w.ipvsTxt, "\n") {
		if f := strings.Fields(line); len(f) >= 3 && (f[0] == "TCP" || f[0] == "UDP" || f[0] == "SCTP") {
			return f[2]
		}
	}
	return "rr"
}

// masqMark is the mark KP-IPVS-MARK-MASQ sets, as listed, else kp's
// default.
func (w *pathWalk) masqMark() uint32 {
	for _, l := range w.listed.Rules(iptables.TableNAT, chainMarkMasq) {
		f := strings.Fields(l)
		if i := slices.Index(f, "--or-mark"); i >= 0 && i+1 < len(f) {
			if v, err := strconv.ParseUint(strings.Split(f[i+1], "/")[0], 0, 32); err == nil {
				return uint32(v)
			}
		}
	}
	return defaultMasqMark
}

// inSet answers an ipset match from the rendered entries, as ipset
// matches them: the flags pick each part of the key from the packet.
func (w *pathWalk) inSet(set, flags string) bool {
	p := w.pkt
	dirs := strings.Split(flags, ",")
	addr := func(d string) netip.Addr {
		if d == "src" {
			return p.Src
		}
		return p.Dst
	}
	port := func(d string) string {
		if d == "src" {
			return p.Proto + ":" + strconv.Itoa(int(p.SPort))
		}
		return p.Proto + ":" + strconv.Itoa(int(p.DPort))
	}
	for _, e := range w.sets[set] {
		parts := strings.Split(e, ",")
		switch {
		case len(dirs) == 1 && len(parts) == 1:
			if a, err := netip.ParseAddr(e); err == nil {
				if a == addr(dirs[0]) {
					return true
				}
			} else if dirs[0] == "dst" && e == strconv.Itoa(int(p.DPort)) || dirs[0] == "src" && e == strconv.Itoa(int(p.SPort)) {
				return true
			}
		case len(parts) >= 2 && len(dirs) >= 2 && len(parts) == len(dirs):
			if parts[0] != addr(dirs[0]).String() || parts[1] != port(dirs[1]) {
				continue
			}
			if len(parts) == 2 || prefixOrAddrHas(parts[2], addr(dirs[2])) {
				return true
			}
		}
	}
	return false
}

func prefixOrAddrHas(s string, a netip.Addr) bool {
	if pf, err := netip.ParsePrefix(s); err == nil {
		return pf.Contains(a)
	}
	b, err := netip.ParseAddr(s)
	return err == nil && b == a
}

// run walks the hooks in the kernel's order. A packet from a remote
// client: nat PREROUTING, then INPUT (filter, then IPVS) for a local
// destination, or FORWARD; what IPVS sends on goes out through OUTPUT
// (filter; nat OUTPUT does not run again for the connection) and nat
// POSTROUTING. The node's own packet: nat OUTPUT, IPVS (its OUTPUT hook
// runs after nat's), filter OUTPUT, nat POSTROUTING.
func (w *pathWalk) run() {
	if w.e.Source.Node {
		w.hook(iptables.TableNAT, "OUTPUT")
		w.ipvs()
		w.hook(iptables.TableFilter, "OUTPUT")
		w.hook(iptables.TableNAT, "POSTROUTING")
		return
	}
	w.hook(iptables.TableNAT, "PREROUTING")
	if w.pkt.DstLocal {
		w.hook(iptables.TableFilter, "INPUT")
		if !w.ipvs() {
			return // delivered to the node's own sockets
		}
		w.hook(iptables.TableFilter, "OUTPUT")
	} else {
		w.hook(iptables.TableFilter, "FORWARD")
	}
	w.hook(iptables.TableNAT, "POSTROUTING")
}

// hook runs kp's jumps of a built-in chain, in their order, until one
// ends the packet's walk of that chain.
func (w *pathWalk) hook(t iptables.Table, chain string) {
	if w.stopped {
		return
	}
	var js []iptables.HookJump
	for _, j := range w.jumps(t, chain) {
		js = append(js, iptables.HookJump{To: j.to, Rule: w.jumpText(t, chain, j)})
	}
	v := w.listed.WalkHook(w.chains, t, chain, js, w.pkt, func(s explain.RuleStep) { w.steps = append(w.steps, s) })
	w.stopped = v == iptables.WalkDrop || v == iptables.WalkReject
}

// jumps are kp's jumps of a built-in chain in the kernel's order: as
// listed, else as restoreInput inserts them (each -I before the others).
func (w *pathWalk) jumps(t iptables.Table, chain string) []jump {
	var mine []jump
	for _, j := range jumps {
		if j.table == t && j.from == chain {
			mine = append(mine, j)
		}
	}
	out, listed := iptables.ListedOrder(w.listed, t, chain, iptables.IPVSChainPrefix, mine, func(j jump) string { return j.to })
	if !listed {
		slices.Reverse(out)
	}
	return out
}

func (w *pathWalk) jumpText(t iptables.Table, chain string, j jump) string {
	if l := w.listed.JumpLine(t, chain, j.to); l != "" {
		return l
	}
	return strings.Replace(j.line(), "-I ", "-A ", 1)
}

// ipvs is IPVS's step: the virtual server at the packet's destination,
// and the real servers it may choose. It reports whether IPVS took the
// packet (and sends it on to a real server).
func (w *pathWalk) ipvs() bool {
	if w.stopped {
		return false
	}
	k := vsKey{Proto: proxyProtocol(w.pkt.Proto), Addr: w.pkt.Dst, Port: w.pkt.DPort}
	vs, ok := w.servers[k]
	if !ok {
		return false
	}
	step := explain.RuleStep{Where: virtualServerWhere(k), Rule: w.serverText(vs)}
	dests := vs.Dests
	if a := w.e.Affinity; a != nil && a.PinnedTo != "" {
		if ap, err := netip.ParseAddrPort(a.PinnedTo); err == nil && slices.Contains(dests, ap) {
			dests = []netip.AddrPort{ap}
		}
	}
	switch len(dests) {
	case 0:
		// No real server: IPVS answers ICMP port unreachable.
		step.Verdict = "reject"
		w.steps = append(w.steps, step)
		w.stopped = true
		return false
	case 1:
		step.Verdict = "to " + dests[0].String()
	default:
		alts := make([]string, len(dests))
		for i, d := range dests {
			alts[i] = "to " + d.String()
		}
		step.Verdict = "one of: " + strings.Join(alts, " | ")
	}
	w.steps = append(w.steps, step)
	// What IPVS sends on goes to a real server: the POSTROUTING rules
	// match that (the hairpin set's entries are by real server). When the
	// choice is random, the client's own address if it is one of them
	// (hairpin), else the first.
	d := dests[0]
	if i := slices.IndexFunc(dests, func(d netip.AddrPort) bool { return d.Addr() == w.pkt.Src }); i >= 0 {
		d = dests[i]
	}
	w.pkt.Dst, w.pkt.DPort, w.pkt.DstLocal = d.Addr(), d.Port(), w.local[d.Addr()]
	return true
}

// virtualServerWhere names a virtual server as a RuleStep's Where (and an
// e2e trace of the IPVS connection table): "ipvs TCP 10.96.0.10:80".
func virtualServerWhere(k vsKey) string {
	return fmt.Sprintf("ipvs %s %s", k.Proto, netip.AddrPortFrom(k.Addr, k.Port))
}

// serverText is the virtual server's line as listed (ipvsadm -Ln), else
// as the backend renders it: scheduler and persistence.
func (w *pathWalk) serverText(vs *VirtualServer) string {
	want := fmt.Sprintf("%s %s", vs.Key.Proto, netip.AddrPortFrom(vs.Key.Addr, vs.Key.Port))
	for _, line := range strings.Split(w.ipvsTxt, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0]+" "+f[1] == want {
			return strings.Join(f, " ")
		}
	}
	s := want + " " + vs.Scheduler
	if vs.Timeout > 0 {
		s += fmt.Sprintf(" persistent %d", vs.Timeout)
	}
	return s
}

func proxyProtocol(lower string) v1.Protocol { return v1.Protocol(strings.ToUpper(lower)) }
