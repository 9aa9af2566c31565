package userspace

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

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

// Redirect is one rule of the table as a plain value: traffic to Addr (or,
// with NodePort set, to any local address) on Protocol/Port goes to the
// proxy's listener ToPort, or is rejected when Reject is set (the service
// port has no usable endpoint).
type Redirect struct {
	Comment  string
	Addr     netip.Addr // invalid for a NodePort rule
	NodePort bool
	Protocol v1.Protocol
	Port     int32
	ToPort   int
	Reject   bool
}

func (r Redirect) String() string {
	dst := r.Addr.String()
	if r.NodePort {
		dst = "fib daddr type local"
	}
	verdict := fmt.Sprintf("redirect to :%d", r.ToPort)
	if r.Reject {
		verdict = "reject"
	}
	return fmt.Sprintf("%s %s dport %d %s comment %q", dst, strings.ToLower(string(r.Protocol)), r.Port, verdict, r.Comment)
}

// listenerPorts are the proxy's listener ports for one service port:
// internal traffic (ClusterIPs) and external (NodePort, externalIPs,
// LoadBalancer IPs).
type listenerPorts struct{ internal, external int }

// renderRedirects returns family f's rules for every service port of s,
// sorted so that equal States render equal rule lists.
func renderRedirects(f proxy.Family, s *proxy.State, ports map[proxy.ServicePortName]listenerPorts, usable map[proxy.ServicePortName]bool) []Redirect {
	var out []Redirect
	for name, sp := range s.Services {
		lp, ok := ports[name]
		if !ok {
			continue
		}
		reject := !usable[name]
		add := func(a netip.Addr, nodePort bool, port int32, to int) {
			out = append(out, Redirect{Comment: name.String(), Addr: a, NodePort: nodePort, Protocol: sp.Protocol,
				Port: port, ToPort: to, Reject: reject})
		}
		for _, a := range proxy.FilterAddrs(f, sp.ClusterIPs) {
			add(a, false, sp.Port, lp.internal)
		}
		for _, a := range proxy.FilterAddrs(f, append(slices.Clone(sp.ExternalIPs), sp.LoadBalancerIPs...)) {
			add(a, false, sp.Port, lp.external)
		}
		if sp.NodePort != 0 {
			add(netip.Addr{}, true, sp.NodePort, lp.external)
		}
	}
	slices.SortFunc(out, func(a, b Redirect) int {
		if c := strings.Compare(a.Comment, b.Comment); c != 0 {
			return c
		}
		return strings.Compare(a.String(), b.String())
	})
	return out
}

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

// applyRedirects replaces family f's table content with rules in one
// netlink batch: one kernel transaction, so traffic sees the old rules or
// the new, never a mix or an empty table.
func applyRedirects(conn *nftables.Conn, f proxy.Family, rules []Redirect) error {
	t := conn.AddTable(&nftables.Table{Name: TableName, Family: nftFamily(f)})
	chains := map[string]*nftables.Chain{}
	for _, cs := range chainSpecs {
		policy := nftables.ChainPolicyAccept
		c := conn.AddChain(&nftables.Chain{Name: cs.name, Table: t, Type: cs.typ, Hooknum: cs.hook,
			Priority: cs.prio, Policy: &policy})
		conn.FlushChain(c)
		chains[cs.name] = c
	}
	for _, r := range rules {
		match := matchExprs(f, r)
		ud := userdata.AppendString(nil, userdata.TypeComment, r.Comment)
		if r.Reject {
			rej := rejectExpr(f, r.Protocol)
			for _, name := range []string{"filter-input", "filter-forward", "filter-output"} {
				conn.AddRule(&nftables.Rule{Table: t, Chain: chains[name], Exprs: append(slices.Clone(match), rej), UserData: ud})
			}
			continue
		}
		redir := []expr.Any{
			&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(uint16(r.ToPort))},
			&expr.Redir{RegisterProtoMin: 1},
		}
		for _, name := range []string{"prerouting", "output"} {
			conn.AddRule(&nftables.Rule{Table: t, Chain: chains[name], Exprs: append(slices.Clone(match), redir...), UserData: ud})
		}
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("write table %s %s (%d rules): %w", familyName(f), TableName, len(rules), err)
	}
	return nil
}

func matchExprs(f proxy.Family, r Redirect) []expr.Any {
	var out []expr.Any
	if r.NodePort {
		out = append(out,
			&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)})
	} else {
		off, n := uint32(16), uint32(4)
		if f == proxy.IPv6 {
			off, n = 24, 16
		}
		out = append(out,
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: r.Addr.AsSlice()})
	}
	port := make([]byte, 2)
	binary.BigEndian.PutUint16(port, uint16(r.Port))
	return append(out,
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{protoNumber(r.Protocol)}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: port})
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
