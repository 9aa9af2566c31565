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

// Sets and maps of the table: per-packet cost does not grow with the
// number of Services (one lookup per chain), only the LoadBalancer IPs
// with source ranges and the Service CIDRs are rules of their own.
const (
	// mapRedirects: daddr . l4proto . dport -> listener port.
	mapRedirects = "redirects"
	// mapNodePortRedirects: l4proto . dport -> listener port, for local
	// destinations.
	mapNodePortRedirects = "nodeport-redirects"
	// setNoEndpoints: daddr . l4proto . dport of service ports without
	// endpoints (rejected).
	setNoEndpoints = "no-endpoints"
	// setNodePortNoEndpoints: l4proto . dport, for local destinations.
	setNodePortNoEndpoints = "nodeport-no-endpoints"
	// setClusterIPs: ClusterIPs, whose other ports are rejected.
	setClusterIPs = "cluster-ips"
)

// nftSets are the table's sets for family f.
func nftSets(t *nftables.Table, f proxy.Family) map[string]*nftables.Set {
	addr := nftables.TypeIPAddr
	if f == proxy.IPv6 {
		addr = nftables.TypeIP6Addr
	}
	app := nftables.MustConcatSetType(addr, nftables.TypeInetProto, nftables.TypeInetService)
	pp := nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService)
	return map[string]*nftables.Set{
		mapRedirects:           {Table: t, Name: mapRedirects, KeyType: app, Concatenation: true, IsMap: true, DataType: nftables.TypeInetService},
		mapNodePortRedirects:   {Table: t, Name: mapNodePortRedirects, KeyType: pp, Concatenation: true, IsMap: true, DataType: nftables.TypeInetService},
		setNoEndpoints:         {Table: t, Name: setNoEndpoints, KeyType: app, Concatenation: true},
		setNodePortNoEndpoints: {Table: t, Name: setNodePortNoEndpoints, KeyType: pp, Concatenation: true},
		setClusterIPs:          {Table: t, Name: setClusterIPs, KeyType: addr},
	}
}

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
	k = append(k, protoNumber(p), 0, 0, 0)
	return append(binary.BigEndian.AppendUint16(k, uint16(port)), 0, 0)
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
	// The sets before the rules that name them (one transaction: the
	// kernel resolves a rule's set by name as it adds the rule).
	sets := nftSets(t, f)
	setNames := []string{mapRedirects, mapNodePortRedirects, setNoEndpoints, setNodePortNoEndpoints, setClusterIPs}
	for _, name := range setNames {
		if err := conn.AddSet(sets[name], nil); err != nil {
			return fmt.Errorf("table %s %s: set %s: %w", familyName(f), TableName, name, err)
		}
		conn.FlushSet(sets[name])
	}
	elems := map[string][]nftables.SetElement{}
	seen := map[string]bool{}
	// Each element is commented with its Service (nft list names it).
	elem := func(set string, key []byte, val []byte, comment string) {
		id := set + "/" + string(key)
		if seen[id] {
			return
		}
		seen[id] = true
		elems[set] = append(elems[set], nftables.SetElement{Key: key, Val: val, Comment: comment})
	}
	add := func(chainNames []string, comment string, exprs []expr.Any) {
		ud := userdata.AppendString(nil, userdata.TypeComment, comment)
		for _, name := range chainNames {
			conn.AddRule(&nftables.Rule{Table: t, Chain: chains[name], Exprs: slices.Clone(exprs), UserData: ud})
		}
	}
	nat := []string{"prerouting", "output"}
	filter := []string{"filter-input", "filter-forward", "filter-output"}
	port := func(p int) []byte { return binaryutil.BigEndian.PutUint16(uint16(p)) }
	redir := []expr.Any{&expr.Redir{RegisterProtoMin: 1}}
	var npRedirect, npReject []netip.Prefix // the NodePort address prefixes (invalid: any)
	n := 0
	// Rules of their own first: LoadBalancer IPs with source ranges (the
	// ranges redirected, the rest dropped), before the map lookup.
	for _, r := range rules.Redirects {
		switch {
		case r.Verdict == VerdictDrop:
			add(nat, r.Comment, append(matchExprs(f, r, netip.Prefix{}), &expr.Verdict{Kind: expr.VerdictDrop}))
			n++
		case len(r.SourceRanges) > 0:
			for _, src := range r.SourceRanges {
				add(nat, r.Comment, append(matchExprs(f, r, src),
					&expr.Immediate{Register: 1, Data: port(r.ToPort)}, &expr.Redir{RegisterProtoMin: 1}))
				n++
			}
		case r.NodePort:
			elem(mapNodePortRedirects, elemKey(netip.Addr{}, r.Protocol, r.Port), port(r.ToPort), r.Comment)
			if !slices.Contains(npRedirect, r.NodePortAddrs) {
				npRedirect = append(npRedirect, r.NodePortAddrs)
			}
		default:
			elem(mapRedirects, elemKey(r.Addr, r.Protocol, r.Port), port(r.ToPort), r.Comment)
		}
	}
	add(nat, "service ports", append(append(keyExprs(f, true),
		&expr.Lookup{SourceRegister: 1, SetName: mapRedirects, IsDestRegSet: true, DestRegister: 1}), redir...))
	for _, p := range npRedirect {
		add(nat, "NodePorts", append(append(append(nodePortExprs(f, p), keyExprs(f, false)...),
			&expr.Lookup{SourceRegister: 1, SetName: mapNodePortRedirects, IsDestRegSet: true, DestRegister: 1}), redir...))
	}
	for _, r := range rules.Rejects {
		switch {
		case r.Protocol == "":
			elem(setClusterIPs, r.Addr.AsSlice(), nil, r.Comment)
		case r.NodePort:
			elem(setNodePortNoEndpoints, elemKey(netip.Addr{}, r.Protocol, r.Port), nil, r.Comment)
			if !slices.Contains(npReject, r.NodePortAddrs) {
				npReject = append(npReject, r.NodePortAddrs)
			}
		default:
			elem(setNoEndpoints, elemKey(r.Addr, r.Protocol, r.Port), nil, r.Comment)
		}
	}
	// No endpoints: a TCP reset, else ICMP port unreachable.
	for _, tcp := range []bool{true, false} {
		proto := v1.ProtocolUDP
		if tcp {
			proto = v1.ProtocolTCP
		}
		isTCP := []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}}}
		if !tcp {
			isTCP[1] = &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{unix.IPPROTO_TCP}}
		}
		add(filter, "service ports without endpoints", append(append(slices.Clone(isTCP), append(keyExprs(f, true),
			&expr.Lookup{SourceRegister: 1, SetName: setNoEndpoints})...), rejectExpr(f, proto)))
		for _, p := range npReject {
			add(filter, "NodePorts without endpoints", append(append(append(slices.Clone(isTCP), nodePortExprs(f, p)...),
				append(keyExprs(f, false), &expr.Lookup{SourceRegister: 1, SetName: setNodePortNoEndpoints})...), rejectExpr(f, proto)))
		}
	}
	add(filter, "ClusterIPs: other ports", append(keyExprs(f, true)[:1:1],
		&expr.Lookup{SourceRegister: 1, SetName: setClusterIPs}, rejectExpr(f, "")))
	for _, p := range rules.Drops {
		add([]string{"filter-forward", "filter-output"}, "unallocated Service addresses",
			append(prefixExprs(f, p, false), &expr.Verdict{Kind: expr.VerdictDrop}))
		n++
	}
	for _, name := range setNames {
		for _, es := range elemChunks(elems[name]) {
			if err := conn.SetAddElements(sets[name], es); err != nil {
				return fmt.Errorf("table %s %s: set %s: %w", familyName(f), TableName, name, err)
			}
		}
		n += len(elems[name])
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("write table %s %s (%d rules and elements): %w", familyName(f), TableName, n, err)
	}
	return nil
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

// maxElemBytes bounds one NEWSETELEM message's element list: a netlink
// attribute's length is 16 bits, so a list past 64 KiB (about 1,000
// elements with their comments) is refused as "length too short or too
// large".
const maxElemBytes = 32 << 10

// elemChunks splits es into lists of at most maxElemBytes (a generous
// estimate of each element's encoding).
func elemChunks(es []nftables.SetElement) [][]nftables.SetElement {
	var out [][]nftables.SetElement
	start, size := 0, 0
	for i, e := range es {
		n := len(e.Key) + len(e.Val) + len(e.Comment) + 64
		if size+n > maxElemBytes && i > start {
			out = append(out, es[start:i])
			start, size = i, 0
		}
		size += n
	}
	if start < len(es) {
		out = append(out, es[start:])
	}
	return out
}
