package nft

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// The walk of one packet through a table's objects, as the kernel runs
// them: kp explain's nftables rule path (explain.go) is what this finds in
// the very objects a sync writes, expression by expression, not a second
// description of kp's rules that could drift from them. It evaluates the
// expressions kp's rule builder emits (rule.go) and no others: a rule with
// another one is an error, so a new kind of rule cannot be explained wrong
// in silence.

// walkPacket is the first packet of a connection as the rules see it.
type walkPacket struct {
	nh    []byte // network header: 20 bytes (IPv4) or 40 (IPv6)
	th    []byte // transport header: ports, and TCP flags at 13
	proto uint8
	iif   string // "" when the node sent it
	mark  uint32
	// Conntrack: the connection's mark, whether it was DNATed, and
	// whether its NAT bindings are set up (nat chains run once per
	// connection and direction of rewriting).
	ctMark           uint32
	ctDNAT           bool
	dstNATDone, snat bool
}

func newWalkPacket(f family, src, dst netip.AddrPort, proto uint8, iif string) *walkPacket {
	p := &walkPacket{th: make([]byte, 20), proto: proto, iif: iif}
	if f.v6 {
		p.nh = make([]byte, 40)
	} else {
		p.nh = make([]byte, 20)
	}
	p.setAddr(f, true, src.Addr())
	p.setAddr(f, false, dst.Addr())
	binary.BigEndian.PutUint16(p.th[0:], src.Port())
	binary.BigEndian.PutUint16(p.th[2:], dst.Port())
	if proto == 6 {
		p.th[13] = 0x02 // SYN: a connection's first packet
	}
	return p
}

func (p *walkPacket) setAddr(f family, src bool, a netip.Addr) {
	off, _ := (&ruleBuilder{fam: f}).addrOffset(src)
	copy(p.nh[off:], a.AsSlice())
}

func (p *walkPacket) addr(f family, src bool) netip.Addr {
	off, n := (&ruleBuilder{fam: f}).addrOffset(src)
	a, _ := netip.AddrFromSlice(p.nh[off : off+n])
	return a
}

func (p *walkPacket) dst(f family) netip.AddrPort {
	return netip.AddrPortFrom(p.addr(f, false), binary.BigEndian.Uint16(p.th[2:]))
}

// walkStep is one rule the packet matched: its chain, its index there,
// and its verdict as the kernel's trace words it.
type walkStep struct {
	chain   string
	index   int
	rule    *Rule
	verdict string
	element string
}

// walker runs one packet through a table's objects.
type walker struct {
	v     *objects
	f     family
	pkt   *walkPacket
	local func(netip.Addr) bool
	steps []walkStep
	// choices drive the random choices (numgen): the i-th one made takes
	// choices[i], and the first alternative past them; widths counts the
	// alternatives of each choice made.
	choices []uint32
	widths  []uint32
	// outcome is what became of the packet: "dnat", "reject", "drop", or
	// "" (accepted unchanged).
	outcome string
	dnatTo  netip.AddrPort
	err     error
}

type hookPoint int

const (
	hookPrerouting hookPoint = iota
	hookInput
	hookForward
	hookOutput
	hookPostrouting
)

var hookNums = map[hookPoint]*nftables.ChainHook{hookPrerouting: nftables.ChainHookPrerouting, hookInput: nftables.ChainHookInput,
	hookForward: nftables.ChainHookForward, hookOutput: nftables.ChainHookOutput, hookPostrouting: nftables.ChainHookPostrouting}

// run takes the packet along the hooks the kernel passes it through: from
// the node itself output and postrouting (and, to a local address, back in
// through loopback: prerouting and input); from elsewhere prerouting, then
// input when the (DNATed) destination is the node's, else forward and
// postrouting.
func (w *walker) run(fromNode bool) {
	if fromNode {
		if !w.hook(hookOutput) || !w.hook(hookPostrouting) {
			return
		}
		if w.local(w.pkt.addr(w.f, false)) {
			_ = w.hook(hookPrerouting) && w.hook(hookInput)
		}
		return
	}
	if !w.hook(hookPrerouting) {
		return
	}
	if w.local(w.pkt.addr(w.f, false)) {
		w.hook(hookInput)
		return
	}
	_ = w.hook(hookForward) && w.hook(hookPostrouting)
}

// hook runs the base chains of hook h in priority order; it reports
// whether the packet goes on. A nat chain runs only for a connection whose
// binding of that direction is not set up yet (the kernel's
// nf_nat_initialized): once per connection.
func (w *walker) hook(h hookPoint) bool {
	var bases []*Chain
	for _, c := range w.v.chains {
		if c.Hook != nil && *c.Hook.Hook == *hookNums[h] {
			bases = append(bases, c)
		}
	}
	slices.SortFunc(bases, func(a, b *Chain) int { return int(a.Hook.Priority) - int(b.Hook.Priority) })
	for _, c := range bases {
		if c.Hook.Type == nftables.ChainTypeNAT {
			done := &w.pkt.dstNATDone
			if h == hookPostrouting || h == hookInput {
				done = &w.pkt.snat
			}
			if *done {
				continue
			}
			*done = true
		}
		if !w.baseChain(c) {
			return false
		}
		if w.dnatTo.IsValid() {
			w.pkt.setAddr(w.f, false, w.dnatTo.Addr())
			binary.BigEndian.PutUint16(w.pkt.th[2:], w.dnatTo.Port())
			w.pkt.ctDNAT, w.outcome, w.dnatTo = true, "dnat", netip.AddrPort{}
		}
	}
	return true
}

// maxJumpDepth is the kernel's NFT_JUMP_STACK_SIZE.
const maxJumpDepth = 16

// baseChain runs base chain c with its jumps and gotos; it reports whether
// the packet is accepted (false: dropped or rejected, or the walk failed).
func (w *walker) baseChain(c *Chain) bool {
	type frame struct {
		chain *Chain
		next  int
	}
	var stack []frame
	cur, i := c, 0
	for w.err == nil {
		if i >= len(cur.Rules) {
			if len(stack) == 0 {
				return true // the base chain's policy: accept
			}
			cur, i = stack[len(stack)-1].chain, stack[len(stack)-1].next
			stack = stack[:len(stack)-1]
			continue
		}
		r := &cur.Rules[i]
		res, matched := w.rule(r)
		i++
		if !matched {
			continue
		}
		w.steps = append(w.steps, walkStep{chain: cur.Name, index: i - 1, rule: r, verdict: res.text, element: res.element})
		switch res.kind {
		case expr.VerdictJump, expr.VerdictGoto:
			next := w.v.chains[res.chain]
			if next == nil {
				w.err = fmt.Errorf("chain %s: rule %q goes to chain %s, which kp does not write", cur.Name, r.Text, res.chain)
				return false
			}
			if res.kind == expr.VerdictJump {
				if len(stack) == maxJumpDepth {
					w.err = fmt.Errorf("chain %s: jumps nest deeper than the kernel allows", cur.Name)
					return false
				}
				stack = append(stack, frame{cur, i})
			}
			cur, i = next, 0
		case expr.VerdictReturn:
			i = len(cur.Rules)
		case expr.VerdictAccept:
			return true
		case expr.VerdictDrop:
			if w.outcome == "" {
				w.outcome = "drop"
			}
			return false
		}
	}
	return false
}
