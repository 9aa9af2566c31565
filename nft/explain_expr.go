package nft

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// One rule of the walk (explain_walk.go): its expressions evaluated as the
// kernel evaluates them, on registers, sets and maps of the table's objects.

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
