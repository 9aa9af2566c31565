package userspace

import (
	"encoding/binary"
	"net"
	"net/netip"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
)

// The nftables expressions of the redirect table's rules and the keys of
// its sets (redirect_nft.go writes them).

// Registers: an address in NFT_REG_1 (its 32-bit parts from NFT_REG32_00),
// then l4proto and dport in the 32-bit registers after it.
const (
	regAddr  = 1
	reg32_00 = 8
)

// keyExprs loads "daddr . l4proto . dport" (withAddr) or "l4proto .
// dport" from register 1 on.
func keyExprs(f proxy.Family, withAddr bool) []expr.Any {
	var out []expr.Any
	proto, port := uint32(1), uint32(reg32_00+1)
	if withAddr {
		off, n := uint32(16), uint32(4)
		if f == proxy.IPv6 {
			off, n = 24, 16
		}
		out = append(out, &expr.Payload{DestRegister: regAddr, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n})
		proto = reg32_00 + n/4
		port = proto + 1
	}
	return append(out,
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: proto},
		&expr.Payload{DestRegister: port, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2})
}

// elemKey is a set key "addr . proto . port" (addr invalid: "proto .
// port"), each part padded to a 32-bit register.
func elemKey(a netip.Addr, p v1.Protocol, port int32) []byte {
	var k []byte
	if a.IsValid() {
		k = append(k, a.AsSlice()...)
	}
	k = append(k, proxy.ProtocolNumber(p), 0, 0, 0)
	return append(binary.BigEndian.AppendUint16(k, uint16(port)), 0, 0)
}

// nodePortExprs matches a local destination (in p when valid).
func nodePortExprs(f proxy.Family, p netip.Prefix) []expr.Any {
	var out []expr.Any
	if p.IsValid() {
		out = append(out, prefixExprs(f, p, false)...)
	}
	return append(out,
		&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)})
}

// orAny is ps, or one invalid prefix (no source match) when ps is empty.
func orAny(ps []netip.Prefix) []netip.Prefix {
	if len(ps) == 0 {
		return []netip.Prefix{{}}
	}
	return ps
}

// matchExprs matches r's destination (and src, when valid).
func matchExprs(f proxy.Family, r Redirect, src netip.Prefix) []expr.Any {
	var out []expr.Any
	if src.IsValid() {
		out = append(out, prefixExprs(f, src, true)...)
	}
	if r.NodePort {
		if r.NodePortAddrs.IsValid() {
			out = append(out, prefixExprs(f, r.NodePortAddrs, false)...)
		}
		out = append(out,
			&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)})
	} else {
		out = append(out, prefixExprs(f, netip.PrefixFrom(r.Addr, r.Addr.BitLen()), false)...)
	}
	if r.Protocol == "" {
		return out // every port
	}
	port := make([]byte, 2)
	binary.BigEndian.PutUint16(port, uint16(r.Port))
	return append(out,
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proxy.ProtocolNumber(r.Protocol)}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: port})
}

// prefixExprs matches the source (src) or destination address against p.
func prefixExprs(f proxy.Family, p netip.Prefix, src bool) []expr.Any {
	off, n := uint32(16), uint32(4)
	if f == proxy.IPv6 {
		off, n = 24, 16
	}
	if src {
		off -= n // saddr precedes daddr in both headers
	}
	out := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n}}
	if p.Bits() < p.Addr().BitLen() {
		mask := net.CIDRMask(p.Bits(), p.Addr().BitLen())
		out = append(out, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: n, Mask: mask, Xor: make([]byte, n)})
	}
	return append(out, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Masked().Addr().AsSlice()})
}

// rejectExpr refuses at once: a TCP reset, or ICMP port unreachable.
func rejectExpr(f proxy.Family, p v1.Protocol) expr.Any {
	if p == v1.ProtocolTCP {
		return &expr.Reject{Type: unix.NFT_REJECT_TCP_RST}
	}
	if f == proxy.IPv6 {
		return &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 4} // ICMPV6_PORT_UNREACH
	}
	return &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 3} // ICMP_PORT_UNREACH
}

// ctStateNew matches the first packet of a connection ("ct state new"):
// the filter chains refuse new connections only. A reply addressed to a
// ClusterIP belongs to a connection that is already there: the node's own,
// sourced from the ClusterIP while the address is local (an ipvs proxy's
// dummy interface holds it: the switch from kp's ipvs mode, whose
// interface stays while connections use its virtual servers).
func ctStateNew() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitNEW), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}
