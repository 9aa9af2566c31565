package nft

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/kpproxy/kp/proxy"
	"golang.org/x/sys/unix"
)

// Rule is one nftables rule: the expressions sent to the kernel and the same
// rule in nft syntax, which is what the fake stores, what the bookkeeping
// compares and what a Transaction prints.
type Rule struct {
	Exprs   []expr.Any
	Text    string
	Comment string
}

// String is the rule in nft syntax, with its comment.
func (r *Rule) String() string {
	if r.Comment == "" {
		return r.Text
	}
	return fmt.Sprintf("%s comment %q", r.Text, r.Comment)
}

// ruleBuilder appends expressions and their nft syntax in step, so the two
// cannot drift apart.
type ruleBuilder struct {
	fam   family
	exprs []expr.Any
	text  []string
}

func newRule(fam family) *ruleBuilder { return &ruleBuilder{fam: fam} }

func (b *ruleBuilder) add(text string, e ...expr.Any) *ruleBuilder {
	b.exprs = append(b.exprs, e...)
	b.text = append(b.text, text)
	return b
}

func (b *ruleBuilder) build(comment string) Rule {
	return Rule{Exprs: b.exprs, Text: strings.Join(b.text, " "), Comment: fitComment(comment)}
}

// maxComment is the nft CLI's limit on a comment (NFTNL_UDATA_COMMENT_MAXLEN,
// 128 bytes). The kernel stores longer ones, but `nft -f` refuses a file that
// holds one ("comment too long"), so a listing of kp's table would not
// reload. A Service port's name reaches 191 bytes (namespace, name and port
// name of 63 characters each).
const maxComment = 128

// fitComment fits s into an nft comment: a longer one keeps its start and its
// end (the namespace, and the port name) around "...". The full name is in
// the object names (chains, sets), which the kernel allows 255 bytes.
func fitComment(s string) string {
	if len(s) <= maxComment {
		return s
	}
	const dots = "..."
	head := (maxComment - len(dots)) / 2
	tail := maxComment - len(dots) - head
	return s[:head] + dots + s[len(s)-tail:]
}

// Registers for concatenated keys: 32-bit registers are consecutive, and
// NFT_REG_1 overlays NFT_REG32_00..03, which is what nft itself emits.
const (
	regAddr  = 1
	regFirst = 8 // NFT_REG32_00
)

func (b *ruleBuilder) addrOffset(src bool) (off, n uint32) {
	if b.fam.v6 {
		if src {
			return 8, 16
		}
		return 24, 16
	}
	if src {
		return 12, 4
	}
	return 16, 4
}

func (b *ruleBuilder) loadAddr(src bool, reg uint32) expr.Any {
	off, n := b.addrOffset(src)
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n}
}

func addrField(src bool) string {
	if src {
		return "saddr"
	}
	return "daddr"
}

// addrIs matches "ip daddr 10.0.0.1" (or saddr, or != with neg).
func (b *ruleBuilder) addrIs(src, neg bool, a netip.Addr) *ruleBuilder {
	op, sym := expr.CmpOpEq, ""
	if neg {
		op, sym = expr.CmpOpNeq, "!= "
	}
	return b.add(fmt.Sprintf("%s %s %s%s", b.fam.name, addrField(src), sym, a),
		b.loadAddr(src, 1), &expr.Cmp{Op: op, Register: 1, Data: a.AsSlice()})
}

// addrInSet matches "ip saddr @set" (or != with neg).
func (b *ruleBuilder) addrInSet(src, neg bool, set string) *ruleBuilder {
	sym := ""
	if neg {
		sym = "!= "
	}
	return b.add(fmt.Sprintf("%s %s %s@%s", b.fam.name, addrField(src), sym, set),
		b.loadAddr(src, 1), &expr.Lookup{SourceRegister: 1, SetName: set, Invert: neg})
}

// keyVMap dispatches on "daddr . l4proto . dport" (withAddr) or
// "l4proto . dport" through the named verdict map.
func (b *ruleBuilder) keyVMap(withAddr bool, vmap string) *ruleBuilder {
	text, es := b.loadKey(withAddr)
	es = append(es, &expr.Lookup{SourceRegister: 1, SetName: vmap, IsDestRegSet: true, DestRegister: 0})
	return b.add(fmt.Sprintf("%s vmap @%s", text, vmap), es...)
}

// keyInSet matches "daddr . l4proto . dport" (withAddr) or "l4proto .
// dport" in the named set.
func (b *ruleBuilder) keyInSet(withAddr bool, set string) *ruleBuilder {
	text, es := b.loadKey(withAddr)
	es = append(es, &expr.Lookup{SourceRegister: 1, SetName: set})
	return b.add(fmt.Sprintf("%s @%s", text, set), es...)
}

// loadKey loads "daddr . l4proto . dport" (withAddr) or "l4proto . dport"
// from register 1 on, as nft does.
func (b *ruleBuilder) loadKey(withAddr bool) (string, []expr.Any) {
	var es []expr.Any
	reg := uint32(regFirst)
	text := "meta l4proto . th dport"
	if withAddr {
		_, n := b.addrOffset(false)
		es = append(es, b.loadAddr(false, regAddr))
		reg += n / 4
		text = fmt.Sprintf("%s daddr . %s", b.fam.name, text)
	} else {
		reg = 1
	}
	return text, append(es,
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg},
		&expr.Payload{DestRegister: nextReg(reg), Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2})
}

// nextReg is the 32-bit register after reg (reg 1 is a 128-bit register
// overlaying NFT_REG32_00..03, so the one after it is NFT_REG32_01 when only
// 4 bytes were loaded; callers with reg==1 loaded a 1-byte value).
func nextReg(reg uint32) uint32 {
	if reg == 1 {
		return regFirst + 1
	}
	return reg + 1
}

func (b *ruleBuilder) l4proto(proto uint8) *ruleBuilder {
	return b.add("meta l4proto "+protoName(proto),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}})
}

func (b *ruleBuilder) ctStateNew() *ruleBuilder {
	return b.add("ct state new",
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitNEW), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)})
}

// markClear returns when none of the mark bits are set: "meta mark & M == 0 return".
func (b *ruleBuilder) markUnsetReturn(mark uint32) *ruleBuilder {
	return b.add(fmt.Sprintf("meta mark & 0x%08x == 0x00000000 return", mark),
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(mark), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: make([]byte, 4)},
		&expr.Verdict{Kind: expr.VerdictReturn})
}

// markOr sets "meta mark set meta mark | M".
func (b *ruleBuilder) markOr(mark uint32) *ruleBuilder {
	return b.add(fmt.Sprintf("meta mark set meta mark | 0x%08x", mark),
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(^mark), Xor: binaryutil.NativeEndian.PutUint32(mark)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1})
}

// markXor sets "meta mark set meta mark ^ M".
func (b *ruleBuilder) markXor(mark uint32) *ruleBuilder {
	return b.add(fmt.Sprintf("meta mark set meta mark ^ 0x%08x", mark),
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(0xffffffff), Xor: binaryutil.NativeEndian.PutUint32(mark)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1})
}

func (b *ruleBuilder) masquerade() *ruleBuilder {
	return b.add("masquerade fully-random", &expr.Masq{FullyRandom: true})
}

// counter counts the packets that reach it, in the rule itself: named
// counter objects cost the kernel more than the rest of a full sync.
func (b *ruleBuilder) counter() *ruleBuilder {
	return b.add("counter", &expr.Counter{})
}

func (b *ruleBuilder) dnat(proto uint8, to netip.AddrPort) *ruleBuilder {
	b.l4proto(proto)
	famNum := uint32(unix.NFPROTO_IPV4)
	if b.fam.v6 {
		famNum = unix.NFPROTO_IPV6
	}
	port := make([]byte, 2)
	binary.BigEndian.PutUint16(port, to.Port())
	return b.add(fmt.Sprintf("dnat to %s", to),
		&expr.Immediate{Register: 1, Data: to.Addr().AsSlice()},
		&expr.Immediate{Register: 2, Data: port},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: famNum, RegAddrMin: 1, RegProtoMin: 2, Specified: true})
}

// numgenIs matches "numgen random mod n v": a random number below n (in
// host byte order, as numgen writes it) equals v.
func (b *ruleBuilder) numgenIs(n, v uint32) *ruleBuilder {
	return b.add(fmt.Sprintf("numgen random mod %d %d", n, v),
		&expr.Numgen{Register: 1, Modulus: n, Type: unix.NFT_NG_RANDOM},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(v)})
}

// ctStatusDNAT matches "ct status dnat": the connection was DNATed.
func (b *ruleBuilder) ctStatusDNAT() *ruleBuilder {
	return b.add("ct status dnat",
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(ipsDstNAT), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)})
}

// addrPairInSet matches "ip saddr . ip daddr @set".
func (b *ruleBuilder) addrPairInSet(set string) *ruleBuilder {
	_, n := b.addrOffset(false)
	return b.add(fmt.Sprintf("%s saddr . %s daddr @%s", b.fam.name, b.fam.name, set),
		b.loadAddr(true, regAddr), b.loadAddr(false, regFirst+n/4),
		&expr.Lookup{SourceRegister: regAddr, SetName: set})
}

// updateSet adds the packet's address to a dynamic set, or refreshes its
// timeout: "update @set { ip saddr }" (session affinity).
func (b *ruleBuilder) updateSet(src bool, set string) *ruleBuilder {
	return b.add(fmt.Sprintf("update @%s { %s %s }", set, b.fam.name, addrField(src)),
		b.loadAddr(src, 1), &expr.Dynset{SrcRegKey: 1, SetName: set, Operation: uint32(unix.NFT_DYNSET_OP_UPDATE)})
}

// iifname matches the packet's input interface: "iifname "cbr0"" (the name,
// zero-padded to IFNAMSIZ as nft compares it), or with prefix "iifname
// "veth*"" (the name's first bytes only); != with neg.
func (b *ruleBuilder) iifname(name string, prefix, neg bool) *ruleBuilder {
	op, sym := expr.CmpOpEq, ""
	if neg {
		op, sym = expr.CmpOpNeq, "!= "
	}
	data, text := []byte(name), name
	if prefix {
		text += "*"
	} else {
		data = make([]byte, unix.IFNAMSIZ)
		copy(data, name)
	}
	return b.add(fmt.Sprintf("iifname %s%q", sym, text),
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}, &expr.Cmp{Op: op, Register: 1, Data: data})
}

// fibSaddrLocal matches "fib saddr type local": the packet was sent by this
// node itself (any of its addresses).
func (b *ruleBuilder) fibSaddrLocal() *ruleBuilder {
	return b.add("fib saddr type local",
		&expr.Fib{Register: 1, FlagSADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)})
}

// fibDaddrLocal matches "fib daddr type local": the packet is addressed to
// one of this node's addresses.
func (b *ruleBuilder) fibDaddrLocal() *ruleBuilder {
	return b.add("fib daddr type local",
		&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)})
}

// tcpNotSyn matches a TCP packet that does not open a connection (any of
// FIN, RST or ACK, or no SYN); put l4proto(6) before it.
func (b *ruleBuilder) tcpNotSyn() *ruleBuilder {
	const fin, syn, rst, ack = 0x01, 0x02, 0x04, 0x10
	return b.add("tcp flags & (fin | syn | rst | ack) != syn",
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{fin | syn | rst | ack}, Xor: []byte{0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{syn}})
}

func (b *ruleBuilder) verdict(kind expr.VerdictKind, chain string) *ruleBuilder {
	var text string
	switch kind {
	case expr.VerdictJump:
		text = "jump " + chain
	case expr.VerdictGoto:
		text = "goto " + chain
	case expr.VerdictDrop:
		text = "drop"
	case expr.VerdictReturn:
		text = "return"
	case expr.VerdictAccept:
		text = "accept"
	}
	return b.add(text, &expr.Verdict{Kind: kind, Chain: chain})
}

func (b *ruleBuilder) rejectTCPReset() *ruleBuilder {
	return b.add("reject with tcp reset", &expr.Reject{Type: unix.NFT_REJECT_TCP_RST})
}

func (b *ruleBuilder) rejectPortUnreachable() *ruleBuilder {
	if b.fam.v6 {
		return b.add("reject", &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 4 /* ICMPV6_PORT_UNREACH */})
	}
	return b.add("reject", &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 3 /* ICMP_PORT_UNREACH */})
}

// protoName is nft's spelling of protocol p.
func protoName(p uint8) string {
	if name := proxy.ProtocolOf(p); name != "" {
		return strings.ToLower(string(name))
	}
	return fmt.Sprint(p)
}

// ipsDstNAT is conntrack's IPS_DST_NAT status bit.
const ipsDstNAT = 1 << 5

// ctMarkSetSlot picks one of n endpoint slots from base on, at random, into
// the connection's mark: "ct mark set numgen random mod n offset base" (or
// "ct mark set base" for one). The conntrack mark, not the packet mark: the
// packet mark holds the masquerade bit and whatever the CNI keeps there, and
// policy routing reads it after DNAT; the conntrack mark is read by nothing
// on the way, and the slot it keeps tells which endpoint a connection got.
func (b *ruleBuilder) ctMarkSetSlot(n, base uint32) *ruleBuilder {
	if n <= 1 {
		return b.ctMarkSet(base)
	}
	if base == 0 {
		return b.add(fmt.Sprintf("ct mark set numgen random mod %d", n),
			&expr.Numgen{Register: 1, Modulus: n, Type: unix.NFT_NG_RANDOM},
			&expr.Ct{Register: 1, SourceRegister: true, Key: expr.CtKeyMARK})
	}
	return b.add(fmt.Sprintf("ct mark set numgen random mod %d offset %d", n, base),
		&expr.Numgen{Register: 1, Modulus: n, Type: unix.NFT_NG_RANDOM, Offset: base},
		&expr.Ct{Register: 1, SourceRegister: true, Key: expr.CtKeyMARK})
}

// ctMarkSet sets the connection's mark: "ct mark set 0x0000abcd".
func (b *ruleBuilder) ctMarkSet(mark uint32) *ruleBuilder {
	return b.add(fmt.Sprintf("ct mark set 0x%08x", mark),
		&expr.Immediate{Register: 1, Data: binaryutil.NativeEndian.PutUint32(mark)},
		&expr.Ct{Register: 1, SourceRegister: true, Key: expr.CtKeyMARK})
}

// ctMarkAndOr keeps the mark's bits in keep and sets bits: "ct mark set ct
// mark & 0x00ffffff | 0x00000003" (a shared pick's slot, see sharedPicks;
// bits must be within keep). The kernel's mask leaves bits out (x & mask ^
// bits), which nft lists as this.
func (b *ruleBuilder) ctMarkAndOr(keep, bits uint32) *ruleBuilder {
	mask := keep &^ bits
	text := fmt.Sprintf("ct mark set ct mark & 0x%08x | 0x%08x", keep, bits)
	if bits == 0 {
		text = fmt.Sprintf("ct mark set ct mark & 0x%08x", keep)
	}
	return b.add(text,
		&expr.Ct{Register: 1, Key: expr.CtKeyMARK},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(mask), Xor: binaryutil.NativeEndian.PutUint32(bits)},
		&expr.Ct{Register: 1, SourceRegister: true, Key: expr.CtKeyMARK})
}

// ctMarkMaskedVMap dispatches on the connection's mark's bits in mask
// through the verdict map vmap: "ct mark & 0xff000000 vmap @vmap".
func (b *ruleBuilder) ctMarkMaskedVMap(mask uint32, vmap string) *ruleBuilder {
	return b.add(fmt.Sprintf("ct mark & 0x%08x vmap @%s", mask, vmap),
		&expr.Ct{Register: 1, Key: expr.CtKeyMARK},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(mask), Xor: make([]byte, 4)},
		&expr.Lookup{SourceRegister: 1, SetName: vmap, IsDestRegSet: true, DestRegister: 0})
}

// ctMarkSetKeyMap sets the connection's mark to what "daddr . l4proto .
// dport" maps to in the data map, and breaks the rule where it maps to
// nothing: "ct mark set ip daddr . meta l4proto . th dport map @map".
func (b *ruleBuilder) ctMarkSetKeyMap(m string) *ruleBuilder {
	text, es := b.loadKey(true)
	es = append(es, &expr.Lookup{SourceRegister: 1, SetName: m, IsDestRegSet: true, DestRegister: 1},
		&expr.Ct{Register: 1, SourceRegister: true, Key: expr.CtKeyMARK})
	return b.add(fmt.Sprintf("ct mark set %s map @%s", text, m), es...)
}

// ctMarkVMap dispatches on the connection's mark through the verdict map
// vmap: "ct mark vmap @vmap".
func (b *ruleBuilder) ctMarkVMap(vmap string) *ruleBuilder {
	return b.add(fmt.Sprintf("ct mark vmap @%s", vmap),
		&expr.Ct{Register: 1, Key: expr.CtKeyMARK},
		&expr.Lookup{SourceRegister: 1, SetName: vmap, IsDestRegSet: true, DestRegister: 0})
}

// dnatSlotMap DNATs to the endpoint the connection's slot names in the map:
// "meta l4proto P dnat ip to ct mark map @set". (nft wants the protocol
// matched before a mapping with ports.) The address lands in register 1 and
// the port in the 32-bit register after the address, as nft encodes it.
func (b *ruleBuilder) dnatSlotMap(proto uint8, set string) *ruleBuilder {
	b.l4proto(proto)
	famNum, portReg := uint32(unix.NFPROTO_IPV4), uint32(regFirst+1)
	if b.fam.v6 {
		famNum, portReg = unix.NFPROTO_IPV6, 2
	}
	return b.add(fmt.Sprintf("dnat %s to ct mark map @%s", b.fam.name, set),
		&expr.Ct{Register: 1, Key: expr.CtKeyMARK},
		&expr.Lookup{SourceRegister: 1, SetName: set, IsDestRegSet: true, DestRegister: 1},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: famNum, RegAddrMin: 1, RegProtoMin: portReg, Specified: true})
}
