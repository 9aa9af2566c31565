package iptables

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/kpproxy/kp/explain"
)

// The one reader of iptables rule text for kp explain: a rule's matches
// (WalkPacket.Matches), its target and what it does to the packet
// (WalkPacket.take), the walk of a chain from its first rule (Walk) and
// of a built-in chain's jumps (WalkHook); the listing's rules are read in
// listing.go. The RulePathers of every mode that
// writes iptables chains (iptables, ipvs, userspace) read rules through
// these; what an address alone does not tell (the interface a packet
// arrives on, an ipset's content) the caller answers.

// WalkPacket is the packet a walk matches rules against, with what the
// rules change (the destination by DNAT or REDIRECT, the mark).
type WalkPacket struct {
	// Src is invalid when explain was not told the source: -s then
	// matches as SrcIn says.
	Src, Dst     netip.Addr
	Proto        string // tcp, udp, sctp
	SPort, DPort uint16
	// SrcLocal and DstLocal: the addresses are the node's (addrtype
	// LOCAL).
	SrcLocal, DstLocal bool
	// InLocal: the packet arrives on the interface detect-local names
	// (-i IFACE): it is a pod's.
	InLocal bool
	// LocalCIDRs are detect-local's ranges, which -s of an unknown
	// source matches as InLocal says.
	LocalCIDRs []netip.Prefix
	// Bridged: it arrives through a bridge port (physdev --physdev-is-in).
	Bridged bool
	Mark    uint32
	// CtStates are the conntrack states the packet has (NEW, DNAT ...).
	CtStates []string
	// InSet answers an ipset match: set name and its direction flags
	// ("dst,dst"); nil: no set matches.
	InSet func(set, flags string) bool
	// Pinned is the recent list (--name) the client's affinity entry is
	// on: the one --rcheck matches ("" when none is known).
	Pinned string
}

// WalkStep is a rule the packet matched, with the verdict word of kp
// explain ("jump X", "accept", "return", "continue", "masquerade" ...).
type WalkStep struct {
	Table   Table
	Chain   string
	Index   int // the rule's position in its chain, from 0
	Rule    Rule
	Verdict string
}

// Where names the step's chain as explain does: "nat KP-IPVS-SERVICES".
func (s WalkStep) Where() string { return string(s.Table) + " " + s.Chain }

// Chains finds a chain by table and name.
type Chains func(t Table, name string) *Chain

// ChainIndex indexes chains by table and name.
func ChainIndex(chains []*Chain) Chains {
	m := map[Table]map[string]*Chain{}
	for _, c := range chains {
		if m[c.Table] == nil {
			m[c.Table] = map[string]*Chain{}
		}
		m[c.Table][c.Name] = c
	}
	return func(t Table, name string) *Chain { return m[t][name] }
}

// Terminal verdicts of a walk; "" is none (the packet goes on).
const (
	WalkAccept = "accept"
	WalkDrop   = "drop"
	WalkReject = "reject"
)

// Walk evaluates chain name of table t for p from its first rule, calling
// step for each rule p matches, in order; a jump walks the target chain
// first. It returns the terminal verdict the chain ends in ("" when the
// packet returns or falls off its end).
func Walk(chains Chains, t Table, name string, p *WalkPacket, step func(WalkStep)) string {
	c := chains(t, name)
	if c == nil {
		return ""
	}
	for i, r := range c.Rules {
		if !p.Matches(r.Args) {
			continue
		}
		verdict, out, to := p.take(r.Args, func(to string) bool { return chains(t, to) != nil })
		step(WalkStep{Table: t, Chain: name, Index: i, Rule: r, Verdict: verdict})
		switch out {
		case accept:
			return WalkAccept
		case stop:
			return strings.ToLower(to)
		case ret:
			return ""
		case call, jumpGoto:
			if v := Walk(chains, t, to, p, step); v != "" {
				return v
			}
			if out == jumpGoto {
				return ""
			}
		}
	}
	return ""
}

// outcome is how a rule or chain leaves the walk.
type outcome int

const (
	next     outcome = iota // on to the next rule
	ret                     // back to the calling chain
	accept                  // the hook is done with the packet (ACCEPT, DNAT, MASQUERADE, REDIRECT)
	stop                    // dropped or rejected: the walk ends
	call                    // -j CHAIN: walk it, then on to the next rule
	jumpGoto                // -g CHAIN: walk it, then back to the calling chain
)

// take applies the target of rule args, which p matched: it changes p as
// the target does (DNAT, REDIRECT, MARK) and returns the verdict word as
// kp explain names it (as the nftables trace does: "jump KP-X", "goto
// KP-X", "accept", "continue" for a target that lets the packet go on,
// "dnat to A:P", "redirect to :PORT"), how the rule leaves the walk and
// the target (the chain to walk for call and jumpGoto). isChain reports
// whether a target that is no built-in one is a chain to walk.
func (p *WalkPacket) take(args string, isChain func(string) bool) (string, outcome, string) {
	to, goTo, opts := targetOf(fields(args))
	switch to {
	case "":
		return "continue", next, ""
	case "RETURN":
		return "return", ret, to
	case "ACCEPT", "MASQUERADE":
		return strings.ToLower(to), accept, to
	case "DROP", "REJECT":
		return strings.ToLower(to), stop, to
	case "DNAT":
		dst := option(opts, "--to-destination")
		if ap, err := netip.ParseAddrPort(dst); err == nil {
			p.Dst = ap.Addr()
			p.CtStates = append(p.CtStates, "DNAT")
		}
		return "dnat to " + dst, accept, to
	case "REDIRECT":
		// REDIRECT's new destination is the address of the interface
		// the packet came in on: local, and no Service's.
		port := option(opts, "--to-ports")
		n, _ := strconv.ParseUint(port, 10, 16)
		p.Dst, p.DPort, p.DstLocal = netip.Addr{}, uint16(n), true
		p.CtStates = append(p.CtStates, "DNAT")
		return "redirect to :" + port, accept, to
	case "MARK":
		p.mark(opts)
		return "continue", next, to
	}
	if !isChain(to) && !strings.HasPrefix(to, ownChainPrefix) {
		return "continue", next, to // a target that is no chain of kp's: not walked
	}
	if goTo {
		return "goto " + to, jumpGoto, to
	}
	return "jump " + to, call, to
}

func (p *WalkPacket) mark(targs []string) {
	if v, _, ok := parseMark(option(targs, "--or-mark")); ok {
		p.Mark |= v
	}
	if v, _, ok := parseMark(option(targs, "--xor-mark")); ok {
		p.Mark ^= v
	}
	if v, m, ok := parseMark(option(targs, "--set-xmark")); ok {
		p.Mark = (p.Mark &^ m) ^ v
	}
}

// parseMark reads "0x4000" or "0x4000/0x4000" (mask: all ones without).
func parseMark(s string) (v, m uint32, ok bool) {
	vs, ms, hasMask := strings.Cut(s, "/")
	x, err := strconv.ParseUint(vs, 0, 32)
	if err != nil {
		return 0, 0, false
	}
	m = 0xffffffff
	if hasMask {
		y, err := strconv.ParseUint(ms, 0, 32)
		if err != nil {
			return 0, 0, false
		}
		m = uint32(y)
	}
	return uint32(x), m, true
}

// Matches reports whether p matches every match of args (the part before
// the target). An option it does not know does not match: the walk then
// names a rule too few, never one the kernel would not take.
func (p *WalkPacket) Matches(args string) bool {
	f := fields(args)
	neg := false
	for i := 0; i < len(f); i++ {
		opt := f[i]
		if opt == "-j" || opt == "-g" {
			return true
		}
		if opt == "!" {
			neg = true
			continue
		}
		val := func() string {
			if i+1 < len(f) {
				i++
				return f[i]
			}
			return ""
		}
		var ok bool
		switch opt {
		case "-m", "--comment", "--seconds", "--mask", "--hitcount", "--mode", "--probability", "--every", "--packet":
			// A module, or an option whose part the walk does not
			// decide (the recent entry's age, the random pick): the
			// caller does.
			val()
			continue
		case "--rcheck", "--update", "--set", "--reap", "--rsource", "--rdest":
			continue // read with --name
		case "-p":
			ok = val() == p.Proto
		case "-s":
			ok = p.srcIn(val())
		case "-d":
			ok = inRange(p.Dst, val())
		case "-i":
			val()
			ok = p.InLocal
		case "--dport":
			ok = portIn(p.DPort, val())
		case "--sport":
			ok = portIn(p.SPort, val())
		case "--dst-type":
			ok = val() == "LOCAL" && p.DstLocal
		case "--src-type":
			ok = val() == "LOCAL" && p.SrcLocal
		case "--physdev-is-in":
			ok = p.Bridged
		case "--mark":
			v, m, good := parseMark(val())
			ok = good && p.Mark&m == v
		case "--ctstate":
			ok = slices.ContainsFunc(strings.Split(val(), ","), func(s string) bool { return slices.Contains(p.CtStates, s) })
		case "--match-set":
			name := val()
			ok = p.InSet != nil && p.InSet(name, val())
		case "--name":
			// -m recent: --rcheck (and --update) match the client's
			// entry, --set always matches.
			name := val()
			ok = !slices.Contains(f, "--rcheck") && !slices.Contains(f, "--update") || p.Pinned == name
		default:
			return false
		}
		if ok == neg {
			return false
		}
		neg = false
	}
	return true
}

// srcIn matches the source against -s's value. Without a source (explain
// not told it), a pod's range matches as detect-local said (InLocal), an
// endpoint's address (hairpin) does not, and any other range (a source
// range) is assumed to allow it, as explain does.
func (p *WalkPacket) srcIn(val string) bool {
	if p.Src.IsValid() {
		return inRange(p.Src, val)
	}
	pf, err := netip.ParsePrefix(val)
	switch {
	case err == nil && slices.Contains(p.LocalCIDRs, pf.Masked()):
		return p.InLocal
	case err != nil || pf.IsSingleIP():
		return false // an endpoint's own address: the hairpin match
	}
	return true
}

// inRange matches a against "ADDR", "ADDR/BITS" or "ADDR/MASK" (the
// dispatch tries' "-d 0.0.0.8/0.0.0.12").
func inRange(a netip.Addr, val string) bool {
	addr, mask, hasMask := strings.Cut(val, "/")
	v, err := netip.ParseAddr(addr)
	if err != nil || v.Is4() != a.Is4() {
		return false
	}
	if !hasMask {
		return v == a
	}
	if bits, err := strconv.Atoi(mask); err == nil {
		p, err := v.Prefix(bits)
		return err == nil && p.Contains(a)
	}
	m, err := netip.ParseAddr(mask)
	if err != nil {
		return false
	}
	ab, vb, mb := a.AsSlice(), v.AsSlice(), m.AsSlice()
	for i := range mb {
		if ab[i]&mb[i] != vb[i]&mb[i] {
			return false
		}
	}
	return true
}

// portIn matches p against "PORT" or "FIRST:LAST".
func portIn(p uint16, val string) bool {
	lo, hi, isRange := strings.Cut(val, ":")
	l, err := strconv.Atoi(lo)
	if err != nil {
		return false
	}
	h := l
	if isRange {
		if h, err = strconv.Atoi(hi); err != nil {
			return false
		}
	}
	return int(p) >= l && int(p) <= h
}

// targetOf splits a rule's fields at its -j or -g: the target, whether
// it is -g, and the target's options.
func targetOf(f []string) (to string, goTo bool, opts []string) {
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "-j" || f[i] == "-g" {
			return f[i+1], f[i] == "-g", f[i+2:]
		}
	}
	return "", false, nil
}

func option(f []string, name string) string {
	if i := slices.Index(f, name); i >= 0 && i+1 < len(f) {
		return f[i+1]
	}
	return ""
}

func hasWord(args, w string) bool { return slices.Contains(fields(args), w) }

// fields splits a rule's args as iptables prints them (splitRuleSpec:
// quotes group, a backslash escapes).
func fields(args string) []string {
	f, err := splitRuleSpec(args)
	if err != nil {
		return strings.Fields(args) // an unterminated quote: word by word
	}
	return f
}

// HookJump is a jump of a built-in chain to one of kp's chains: its
// matches, its target and its text.
type HookJump struct{ Match, To, Rule string }

// WalkHook walks p through kp's jumps of built-in chain from of table t,
// in the kernel's order: for each jump p matches, the jump's step, then
// Walk of its chain (each step's text as listed), until a chain ends the
// hook. It returns the verdict that ended it ("" for none; WalkDrop and
// WalkReject end the packet's walk too).
func (l Listing) WalkHook(chains Chains, t Table, from string, jumps []HookJump, p *WalkPacket, step func(explain.RuleStep)) string {
	for _, j := range jumps {
		if !p.Matches(j.Match) {
			continue
		}
		step(explain.RuleStep{Where: string(t) + " " + from, Rule: j.Rule, Verdict: "jump " + j.To})
		if v := Walk(chains, t, j.To, p, func(s WalkStep) { step(l.RuleStep(s)) }); v != "" {
			return v
		}
	}
	return ""
}
