package nft

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
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

// ruleResult is a matched rule's verdict: kind (VerdictContinue when the
// rule has none), its chain, and its trace wording ("jump X", "dnat to
// A:P", "reject"...); element is the set or map element it matched.
type ruleResult struct {
	kind    expr.VerdictKind
	chain   string
	text    string
	element string
}

// regs are the kernel's registers: NFT_REG_1..4 of 16 bytes overlay the
// 32-bit NFT_REG32_00..15.
type regs [64]byte

func regOffset(r uint32) int {
	if r >= regFirst {
		return int(r-regFirst) * 4
	}
	return int(r-1) * 16
}

// store writes data to register r, zero-padding it to whole 32-bit
// registers as the kernel does.
func (x *regs) store(r uint32, data []byte) {
	off := regOffset(r)
	n := copy(x[off:], data)
	for n%4 != 0 {
		x[off+n] = 0
		n++
	}
}

func (x *regs) load(r uint32, n int) []byte { off := regOffset(r); return x[off : off+n] }

func (x *regs) storeU32(r uint32, v uint32) { x.store(r, binary.NativeEndian.AppendUint32(nil, v)) }

func (x *regs) loadU32(r uint32) uint32 { return binary.NativeEndian.Uint32(x.load(r, 4)) }

// rule evaluates r; matched is false when an expression breaks it (a
// comparison or lookup that fails), which the kernel does not trace.
func (w *walker) rule(r *Rule) (res ruleResult, matched bool) {
	var x regs
	res = ruleResult{kind: expr.VerdictContinue, text: "continue"}
	for i, e := range r.Exprs {
		switch e := e.(type) {
		case *expr.Payload:
			b := w.pkt.nh
			if e.Base == expr.PayloadBaseTransportHeader {
				b = w.pkt.th
			}
			x.store(e.DestRegister, b[e.Offset:e.Offset+e.Len])
		case *expr.Meta:
			if !w.meta(&x, e) {
				return res, false
			}
		case *expr.Ct:
			w.ct(&x, e)
		case *expr.Bitwise:
			src := x.load(e.SourceRegister, int(e.Len))
			out := make([]byte, e.Len)
			for j := range out {
				out[j] = src[j]&e.Mask[j] ^ e.Xor[j]
			}
			x.store(e.DestRegister, out)
		case *expr.Cmp:
			c := bytes.Compare(x.load(e.Register, len(e.Data)), e.Data)
			if !cmpHolds(e.Op, c) {
				return res, false
			}
		case *expr.Immediate:
			x.store(e.Register, e.Data)
		case *expr.Lookup:
			if !w.lookup(&x, e, &res) {
				return res, false
			}
			if res.kind != expr.VerdictContinue {
				return res, true // a verdict map's verdict ends the rule
			}
		case *expr.Fib:
			a := w.pkt.addr(w.f, e.FlagSADDR)
			t := uint32(unix.RTN_UNICAST)
			if w.local(a) {
				t = unix.RTN_LOCAL
			}
			x.storeU32(e.Register, t)
		case *expr.Numgen:
			n := e.Modulus
			// "numgen random mod n v" in a comparison has two outcomes
			// that matter: v, or another number.
			if c, ok := next[*expr.Cmp](r.Exprs, i); ok && c.Register == e.Register && c.Op == expr.CmpOpEq && n > 1 {
				v := binary.NativeEndian.Uint32(c.Data)
				x.storeU32(e.Register, []uint32{v, (v + 1) % n}[w.choose(2)])
				continue
			}
			x.storeU32(e.Register, w.choose(n)+e.Offset)
		case *expr.NAT:
			n := 4
			if w.f.v6 {
				n = 16
			}
			a, _ := netip.AddrFromSlice(x.load(e.RegAddrMin, n))
			w.dnatTo = netip.AddrPortFrom(a, binary.BigEndian.Uint16(x.load(e.RegProtoMin, 2)))
			return ruleResult{kind: expr.VerdictAccept, text: "dnat to " + w.dnatTo.String(), element: res.element}, true
		case *expr.Masq:
			return ruleResult{kind: expr.VerdictAccept, text: "masquerade"}, true
		case *expr.Reject:
			w.outcome = "reject"
			return ruleResult{kind: expr.VerdictDrop, text: "reject"}, true
		case *expr.Verdict:
			return verdictResult(e.Kind, e.Chain, res.element), true
		case *expr.Counter, *expr.Dynset:
			// Counting, and the affinity entry a connection leaves for
			// the next: nothing the first packet's path depends on.
		default:
			w.err = fmt.Errorf("rule %q: kp explain cannot evaluate a %T expression", r.Text, e)
			return res, false
		}
	}
	return res, true
}

func next[T any](es []expr.Any, i int) (T, bool) {
	var zero T
	if i+1 >= len(es) {
		return zero, false
	}
	t, ok := es[i+1].(T)
	return t, ok
}

func cmpHolds(op expr.CmpOp, c int) bool {
	switch op {
	case expr.CmpOpEq:
		return c == 0
	case expr.CmpOpNeq:
		return c != 0
	case expr.CmpOpLt:
		return c < 0
	case expr.CmpOpLte:
		return c <= 0
	case expr.CmpOpGt:
		return c > 0
	}
	return c >= 0
}

func verdictResult(kind expr.VerdictKind, chain, element string) ruleResult {
	res := ruleResult{kind: kind, chain: chain, element: element}
	switch kind {
	case expr.VerdictJump:
		res.text = "jump " + chain
	case expr.VerdictGoto:
		res.text = "goto " + chain
	case expr.VerdictReturn:
		res.text = "return"
	case expr.VerdictAccept:
		res.text = "accept"
	case expr.VerdictDrop:
		res.text = "drop"
	default:
		res.text = "continue"
	}
	return res
}

// choose makes the next random choice among n alternatives.
func (w *walker) choose(n uint32) uint32 {
	k := len(w.widths)
	w.widths = append(w.widths, n)
	if k < len(w.choices) {
		return w.choices[k] % n
	}
	return 0
}

func (w *walker) meta(x *regs, e *expr.Meta) bool {
	switch {
	case e.Key == expr.MetaKeyMARK && e.SourceRegister:
		w.pkt.mark = x.loadU32(e.Register)
	case e.Key == expr.MetaKeyMARK:
		x.storeU32(e.Register, w.pkt.mark)
	case e.Key == expr.MetaKeyL4PROTO:
		x.store(e.Register, []byte{w.pkt.proto})
	case e.Key == expr.MetaKeyIIFNAME:
		name := make([]byte, unix.IFNAMSIZ)
		copy(name, w.pkt.iif)
		x.store(e.Register, name)
	default:
		w.err = fmt.Errorf("kp explain cannot evaluate meta key %d", e.Key)
		return false
	}
	return true
}

func (w *walker) ct(x *regs, e *expr.Ct) {
	switch {
	case e.Key == expr.CtKeyMARK && e.SourceRegister:
		w.pkt.ctMark = x.loadU32(e.Register)
	case e.Key == expr.CtKeyMARK:
		x.storeU32(e.Register, w.pkt.ctMark)
	case e.Key == expr.CtKeySTATE:
		// A connection's first packet is "new" in every hook, back in
		// through loopback too: no reply has been seen.
		x.storeU32(e.Register, expr.CtStateBitNEW)
	case e.Key == expr.CtKeySTATUS:
		var s uint32
		if w.pkt.ctDNAT {
			s |= ipsDstNAT
		}
		x.storeU32(e.Register, s)
	default:
		w.err = fmt.Errorf("kp explain cannot evaluate ct key %d", e.Key)
	}
}

// lookup looks the key in register e.SourceRegister up in the set: a
// verdict map's element gives the rule's verdict, a data map's its data.
func (w *walker) lookup(x *regs, e *expr.Lookup, res *ruleResult) bool {
	el, found := w.find(e.SetName, x, e.SourceRegister)
	if found == e.Invert {
		return false
	}
	if !found {
		return true // "!= @set"
	}
	switch {
	case e.IsDestRegSet && e.DestRegister == 0:
		*res = verdictResult(verdictKinds[el.Verdict], el.Chain, fmt.Sprintf("%s : %s", el.KeyText, el.value()))
	case e.IsDestRegSet:
		x.store(e.DestRegister, el.Data)
		res.element = "ct mark : " + el.DataText
	default:
		res.element = el.KeyText
	}
	return true
}

var verdictKinds = map[verdict]expr.VerdictKind{verdictGoto: expr.VerdictGoto, verdictJump: expr.VerdictJump, verdictDrop: expr.VerdictDrop}

// find looks a key up in set: exactly, or in an interval set the interval
// that holds it (the greatest start or end at or below it, if a start).
func (w *walker) find(set string, x *regs, reg uint32) (Element, bool) {
	es := w.v.elements[set]
	n := 0
	for _, e := range es {
		n = len(e.Key)
		break
	}
	if n == 0 {
		return Element{}, false
	}
	key := x.load(reg, n)
	if s := w.v.sets[set]; s == nil || !s.Interval {
		e, ok := es[keyID(key, false)]
		return e, ok
	}
	var best *Element
	for _, e := range es {
		// At a key that ends one interval and starts the next, the start.
		if bytes.Compare(e.Key, key) <= 0 && (best == nil || bytes.Compare(e.Key, best.Key) > 0 ||
			bytes.Equal(e.Key, best.Key) && best.KeyEnd) {
			best = &e
		}
	}
	if best == nil || best.KeyEnd {
		return Element{}, false
	}
	return *best, true
}
