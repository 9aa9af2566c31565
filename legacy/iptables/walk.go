package iptables

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// The first packet of a connection walked through kp's rendered chains,
// as the kernel evaluates them: what kp explain's RulePathers of the modes
// that write iptables chains (ipvs, userspace) report. The walk matches
// the options those chains use; what an address alone does not tell (the
// interface a packet arrives on, an ipset's content) the caller answers.

// WalkPacket is the packet a walk matches rules against.
type WalkPacket struct {
	Src, Dst     netip.Addr
	Proto        string // tcp, udp, sctp
	SPort, DPort uint16
	// SrcLocal and DstLocal: the addresses are the node's (addrtype
	// LOCAL).
	SrcLocal, DstLocal bool
	// InLocal: the packet arrives on the interface detect-local names
	// (-i IFACE).
	InLocal bool
	// Bridged: it arrives through a bridge port (physdev --physdev-is-in).
	Bridged bool
	Mark    uint32
	// CtStates are the conntrack states the packet has (NEW, DNAT ...).
	CtStates []string
	// InSet answers an ipset match: set name and its direction flags
	// ("dst,dst"); nil: no set matches.
	InSet func(set, flags string) bool
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
// packet returns or falls off its end). MARK changes p.Mark; REDIRECT,
// DNAT and MASQUERADE end the nat table's walk with accept.
func Walk(chains Chains, t Table, name string, p *WalkPacket, step func(WalkStep)) string {
	c := chains(t, name)
	if c == nil {
		return ""
	}
	for i, r := range c.Rules {
		if !p.Matches(r.Args) {
			continue
		}
		target, targs := targetOf(r.Args)
		s := WalkStep{Table: t, Chain: name, Index: i, Rule: r, Verdict: TargetVerdict(r.Args)}
		step(s)
		switch target {
		case "":
			continue
		case "ACCEPT", "MASQUERADE", "REDIRECT", "DNAT", "SNAT":
			return WalkAccept
		case "DROP":
			return WalkDrop
		case "REJECT":
			return WalkReject
		case "RETURN":
			return ""
		case "MARK":
			p.mark(targs)
			continue
		}
		if chains(t, target) == nil {
			continue // a target kp's chains do not define: not walked
		}
		if v := Walk(chains, t, target, p, step); v != "" {
			return v
		}
		if isGoto(r.Args) {
			return ""
		}
	}
	return ""
}

// TargetVerdict is a rule's verdict word as kp explain names it (as the
// nftables trace does): -j KP-X is "jump KP-X", -g "goto KP-X", ACCEPT
// "accept", a target that lets the packet go on (MARK) "continue",
// REDIRECT "redirect to :PORT", DNAT "dnat to A:P".
func TargetVerdict(args string) string {
	target, targs := targetOf(args)
	switch target {
	case "":
		return "continue"
	case "ACCEPT", "DROP", "REJECT", "RETURN", "MASQUERADE":
		return strings.ToLower(target)
	case "MARK":
		return "continue"
	case "REDIRECT":
		return "redirect to :" + optionValue(targs, "--to-ports")
	case "DNAT":
		return "dnat to " + optionValue(targs, "--to-destination")
	}
	if isGoto(args) {
		return "goto " + target
	}
	return "jump " + target
}

func isGoto(args string) bool { return slices.Contains(strings.Fields(args), "-g") }

// targetOf splits a rule's args at its target: the target and its options.
func targetOf(args string) (string, []string) {
	f := strings.Fields(args)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "-j" || f[i] == "-g" {
			return f[i+1], f[i+2:]
		}
	}
	return "", nil
}

func optionValue(f []string, opt string) string {
	for i := 0; i+1 < len(f); i++ {
		if f[i] == opt {
			return f[i+1]
		}
	}
	return ""
}

func (p *WalkPacket) mark(targs []string) {
	v, m, _ := parseMark(optionValue(targs, "--or-mark"))
	if v != 0 || m != 0 {
		p.Mark |= v
	}
	if x := optionValue(targs, "--xor-mark"); x != "" {
		v, _, _ := parseMark(x)
		p.Mark ^= v
	}
	if s := optionValue(targs, "--set-xmark"); s != "" {
		v, m, _ := parseMark(s)
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
	f := strings.Fields(args)
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
		case "-m":
			val()
			continue
		case "-p":
			ok = val() == p.Proto
		case "-s":
			ok = prefixHas(val(), p.Src)
		case "-d":
			ok = prefixHas(val(), p.Dst)
		case "-i":
			val()
			ok = p.InLocal
		case "--dport":
			ok = val() == strconv.Itoa(int(p.DPort))
		case "--sport":
			ok = val() == strconv.Itoa(int(p.SPort))
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
		case "--comment":
			val()
			continue
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

func prefixHas(s string, a netip.Addr) bool {
	if !strings.Contains(s, "/") {
		b, err := netip.ParseAddr(s)
		return err == nil && b == a
	}
	pf, err := netip.ParsePrefix(s)
	return err == nil && pf.Contains(a)
}

// ListedRules reads an iptables-save listing (with or without -c) into
// each chain's rules in order, as "-A CHAIN ..." lines without counters.
func ListedRules(text string) map[string][]string {
	out := map[string][]string{}
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "[") {
			if _, rest, ok := strings.Cut(line, "] "); ok {
				line = rest
			}
		}
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "-A" {
			continue
		}
		out[f[1]] = append(out[f[1]], line)
	}
	return out
}

// Jumps lists, in order, the targets of the listed rules of chain that
// jump (or go) to a chain under prefix.
func Jumps(listed map[string][]string, chain, prefix string) []string {
	var out []string
	for _, l := range listed[chain] {
		if t := RuleTarget(l); strings.HasPrefix(t, prefix) {
			out = append(out, t)
		}
	}
	return out
}
