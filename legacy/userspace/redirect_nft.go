package userspace

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
)

// TableName is kp's userspace-mode table, in families ip and ip6.
const TableName = "kp-userspace"

// Chains of the table. The nat chains redirect (prerouting: traffic
// arriving, including bridged pod traffic with br_netfilter; output:
// traffic the node originates); the filter chains reject traffic of
// service ports without endpoints wherever it would otherwise go
// (forwarded for a ClusterIP, delivered locally for a NodePort).
var chainSpecs = []struct {
	name string
	typ  nftables.ChainType
	hook *nftables.ChainHook
	prio *nftables.ChainPriority
	nat  bool
}{
	{"prerouting", nftables.ChainTypeNAT, nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest, true},
	{"output", nftables.ChainTypeNAT, nftables.ChainHookOutput, nftables.ChainPriorityNATDest, true},
	{"filter-input", nftables.ChainTypeFilter, nftables.ChainHookInput, nftables.ChainPriorityFilter, false},
	{"filter-forward", nftables.ChainTypeFilter, nftables.ChainHookForward, nftables.ChainPriorityFilter, false},
	{"filter-output", nftables.ChainTypeFilter, nftables.ChainHookOutput, nftables.ChainPriorityFilter, false},
}

func familyName(f proxy.Family) string {
	if f == proxy.IPv6 {
		return "ip6"
	}
	return "ip"
}

func nftFamily(f proxy.Family) nftables.TableFamily {
	if f == proxy.IPv6 {
		return nftables.TableFamilyIPv6
	}
	return nftables.TableFamilyIPv4
}

// applyRules replaces family f's table content with rules in one netlink
// batch: one kernel transaction, so traffic sees the old rules or the new,
// never a mix or an empty table.
func applyRules(conn *nftables.Conn, f proxy.Family, rules Rules) error {
	t := conn.AddTable(&nftables.Table{Name: TableName, Family: nftFamily(f)})
	chains := map[string]*nftables.Chain{}
	for _, cs := range chainSpecs {
		policy := nftables.ChainPolicyAccept
		c := conn.AddChain(&nftables.Chain{Name: cs.name, Table: t, Type: cs.typ, Hooknum: cs.hook,
			Priority: cs.prio, Policy: &policy})
		conn.FlushChain(c)
		chains[cs.name] = c
	}
	add := func(chainNames []string, comment string, exprs []expr.Any) {
		ud := userdata.AppendString(nil, userdata.TypeComment, comment)
		for _, name := range chainNames {
			conn.AddRule(&nftables.Rule{Table: t, Chain: chains[name], Exprs: slices.Clone(exprs), UserData: ud})
		}
	}
	nat := []string{"prerouting", "output"}
	filter := []string{"filter-input", "filter-forward", "filter-output"}
	n := 0
	for _, r := range rules.Redirects {
		for _, src := range orAny(r.SourceRanges) {
			exprs := matchExprs(f, r, src)
			if r.Verdict == VerdictDrop {
				exprs = append(exprs, &expr.Verdict{Kind: expr.VerdictDrop})
			} else {
				exprs = append(exprs,
					&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(uint16(r.ToPort))},
					&expr.Redir{RegisterProtoMin: 1})
			}
			add(nat, r.Comment, exprs)
			n++
		}
	}
	for _, r := range rules.Rejects {
		add(filter, r.Comment, append(matchExprs(f, r, netip.Prefix{}), rejectExpr(f, r.Protocol)))
		n++
	}
	for _, p := range rules.Drops {
		add([]string{"filter-forward", "filter-output"}, "unallocated Service addresses",
			append(prefixExprs(f, p, false), &expr.Verdict{Kind: expr.VerdictDrop}))
		n++
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("write table %s %s (%d rules): %w", familyName(f), TableName, n, err)
	}
	return nil
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
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{protoNumber(r.Protocol)}},
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

func protoNumber(p v1.Protocol) byte {
	switch p {
	case v1.ProtocolUDP:
		return unix.IPPROTO_UDP
	case v1.ProtocolSCTP:
		return unix.IPPROTO_SCTP
	}
	return unix.IPPROTO_TCP
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

// deleteTables removes kp's userspace tables, both families; a missing
// table is not an error.
func deleteTables(conn *nftables.Conn) error {
	var errs []error
	for _, f := range []proxy.Family{proxy.IPv4, proxy.IPv6} {
		tables, err := conn.ListTablesOfFamily(nftFamily(f))
		if err != nil {
			errs = append(errs, fmt.Errorf("list %s tables: %w", f, err))
			continue
		}
		for _, t := range tables {
			if t.Name == TableName {
				conn.DelTable(t)
				if err := conn.Flush(); err != nil {
					errs = append(errs, fmt.Errorf("delete table %s %s: %w", familyName(f), TableName, err))
				}
			}
		}
	}
	return errors.Join(errs...)
}
