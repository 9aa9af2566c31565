package userspace

import (
	"errors"
	"fmt"
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
// (forwarded for a ClusterIP, delivered locally for a NodePort), and
// filter-input the new connections to a listener port that nat did not
// redirect (Listener).
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
	// setListeners: l4proto . dport of the proxy's listeners, refused to
	// new connections not redirected.
	setListeners = "listeners"
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
		setListeners:           {Table: t, Name: setListeners, KeyType: pp, Concatenation: true},
	}
}

// applyRules replaces family f's table content with rules in one netlink
// batch: one kernel transaction, so traffic sees the old rules or the new,
// never a mix or an empty table. What goes into the sets is planned first,
// as data (planElements); the batch then declares the table, its chains
// and sets (flushed), adds the nat rules, the filter rules, and last the
// sets' elements.
func applyRules(conn *nftables.Conn, f proxy.Family, rules Rules) (*tableCounts, error) {
	plan := planElements(rules)
	w, err := declareTable(conn, f)
	if err != nil {
		return nil, err
	}
	n := w.natRules(rules.Redirects, plan.npRedirect)
	n += w.filterRules(plan.npReject, rules.Drops)
	w.listenerRules()
	counts := &tableCounts{rules: w.rules, elems: map[string]int{}}
	for _, name := range setOrder {
		for _, es := range elemChunks(plan.elems[name]) {
			if err := conn.SetAddElements(w.sets[name], es); err != nil {
				return nil, fmt.Errorf("table %s %s: set %s: %w", familyName(f), TableName, name, err)
			}
		}
		n += len(plan.elems[name])
		counts.elems[name] = len(plan.elems[name])
	}
	if err := conn.Flush(); err != nil {
		return nil, fmt.Errorf("write table %s %s (%d rules and elements): %w", familyName(f), TableName, n, err)
	}
	return counts, nil
}

// setOrder is the order the sets are declared and filled in.
var setOrder = []string{mapRedirects, mapNodePortRedirects, setNoEndpoints, setNodePortNoEndpoints, setClusterIPs, setListeners}

// ownRule reports whether a redirect is a rule of its own rather than an
// element of a map: a LoadBalancer IP's drop of sources outside its
// ranges, or its redirect of the ranges.
func ownRule(r Redirect) bool { return r.Verdict == VerdictDrop || len(r.SourceRanges) > 0 }

// elementPlan is what one family's sets will hold, and the NodePort
// address prefixes their lookups are restricted to (invalid: any).
type elementPlan struct {
	elems                map[string][]nftables.SetElement
	seen                 map[string]bool
	npRedirect, npReject []netip.Prefix
}

// planElements lists the elements of every set for rules: the redirects
// that are no rule of their own, and the rejects. Each element is
// commented with its Service (nft list names it); a key already listed is
// kept as first listed.
func planElements(rules Rules) *elementPlan {
	p := &elementPlan{elems: map[string][]nftables.SetElement{}, seen: map[string]bool{}}
	for _, r := range rules.Redirects {
		switch {
		case ownRule(r):
		case r.NodePort:
			p.add(mapNodePortRedirects, elemKey(netip.Addr{}, r.Protocol, r.Port), portBytes(r.ToPort), r.Comment)
			if !slices.Contains(p.npRedirect, r.NodePortAddrs) {
				p.npRedirect = append(p.npRedirect, r.NodePortAddrs)
			}
		default:
			p.add(mapRedirects, elemKey(r.Addr, r.Protocol, r.Port), portBytes(r.ToPort), r.Comment)
		}
	}
	for _, r := range rules.Rejects {
		switch {
		case r.Protocol == "":
			p.add(setClusterIPs, r.Addr.AsSlice(), nil, r.Comment)
		case r.NodePort:
			p.add(setNodePortNoEndpoints, elemKey(netip.Addr{}, r.Protocol, r.Port), nil, r.Comment)
			if !slices.Contains(p.npReject, r.NodePortAddrs) {
				p.npReject = append(p.npReject, r.NodePortAddrs)
			}
		default:
			p.add(setNoEndpoints, elemKey(r.Addr, r.Protocol, r.Port), nil, r.Comment)
		}
	}
	for _, l := range rules.Listeners {
		p.add(setListeners, elemKey(netip.Addr{}, l.Protocol, int32(l.Port)), nil, l.Comment)
	}
	return p
}

func (p *elementPlan) add(set string, key, val []byte, comment string) {
	id := set + "/" + string(key)
	if p.seen[id] {
		return
	}
	p.seen[id] = true
	p.elems[set] = append(p.elems[set], nftables.SetElement{Key: key, Val: val, Comment: comment})
}

func portBytes(p int) []byte { return binaryutil.BigEndian.PutUint16(uint16(p)) }

// tableWriter adds one family's table, chains and sets to a netlink batch.
type tableWriter struct {
	conn   *nftables.Conn
	f      proxy.Family
	t      *nftables.Table
	chains map[string]*nftables.Chain
	sets   map[string]*nftables.Set
	rules  map[string]int // rules added, per chain
}

// declareTable adds the table and its chains and sets to the batch, each
// flushed.
func declareTable(conn *nftables.Conn, f proxy.Family) (*tableWriter, error) {
	t := conn.AddTable(&nftables.Table{Name: TableName, Family: nftFamily(f)})
	w := &tableWriter{conn: conn, f: f, t: t, chains: map[string]*nftables.Chain{}, sets: nftSets(t, f), rules: map[string]int{}}
	for _, cs := range chainSpecs {
		policy := nftables.ChainPolicyAccept
		c := conn.AddChain(&nftables.Chain{Name: cs.name, Table: t, Type: cs.typ, Hooknum: cs.hook,
			Priority: cs.prio, Policy: &policy})
		conn.FlushChain(c)
		w.chains[cs.name] = c
	}
	// The sets before the rules that name them (one transaction: the
	// kernel resolves a rule's set by name as it adds the rule).
	for _, name := range setOrder {
		if err := conn.AddSet(w.sets[name], nil); err != nil {
			return nil, fmt.Errorf("table %s %s: set %s: %w", familyName(f), TableName, name, err)
		}
		conn.FlushSet(w.sets[name])
	}
	return w, nil
}

var (
	natChains    = []string{"prerouting", "output"}
	filterChains = []string{"filter-input", "filter-forward", "filter-output"}
)

// add appends a rule of exprs, commented, to each named chain.
func (w *tableWriter) add(chainNames []string, comment string, exprs []expr.Any) {
	ud := userdata.AppendString(nil, userdata.TypeComment, comment)
	for _, name := range chainNames {
		w.rules[name]++
		w.conn.AddRule(&nftables.Rule{Table: w.t, Chain: w.chains[name], Exprs: slices.Clone(exprs), UserData: ud})
	}
}

// natRules adds the nat chains' rules: rules of their own first
// (LoadBalancer IPs with source ranges: the ranges redirected, the rest
// dropped), before the map lookups, of the service addresses and then of
// each NodePort prefix. It returns how many rules of their own it added.
func (w *tableWriter) natRules(redirects []Redirect, npRedirect []netip.Prefix) int {
	f, n := w.f, 0
	for _, r := range redirects {
		switch {
		case r.Verdict == VerdictDrop:
			w.add(natChains, r.Comment, append(matchExprs(f, r, netip.Prefix{}), &expr.Verdict{Kind: expr.VerdictDrop}))
			n++
		case len(r.SourceRanges) > 0:
			for _, src := range r.SourceRanges {
				w.add(natChains, r.Comment, append(matchExprs(f, r, src),
					&expr.Immediate{Register: 1, Data: portBytes(r.ToPort)}, &expr.Redir{RegisterProtoMin: 1}))
				n++
			}
		}
	}
	redir := []expr.Any{&expr.Redir{RegisterProtoMin: 1}}
	w.add(natChains, "service ports", append(append(keyExprs(f, true),
		&expr.Lookup{SourceRegister: 1, SetName: mapRedirects, IsDestRegSet: true, DestRegister: 1}), redir...))
	for _, p := range npRedirect {
		w.add(natChains, "NodePorts", append(append(append(nodePortExprs(f, p), keyExprs(f, false)...),
			&expr.Lookup{SourceRegister: 1, SetName: mapNodePortRedirects, IsDestRegSet: true, DestRegister: 1}), redir...))
	}
	return n
}

// filterRules adds the filter chains' rules, each for new connections
// only (ctStateNew): the lookups of service ports without endpoints (a
// TCP reset, else ICMP port unreachable), of the ClusterIPs' other ports,
// then the drops of unallocated Service addresses. It returns how many
// drops it added.
func (w *tableWriter) filterRules(npReject []netip.Prefix, drops []netip.Prefix) int {
	f, n := w.f, 0
	add := func(chains []string, comment string, exprs []expr.Any) {
		w.add(chains, comment, append(ctStateNew(), exprs...))
	}
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
		add(filterChains, "service ports without endpoints", append(append(slices.Clone(isTCP), append(keyExprs(f, true),
			&expr.Lookup{SourceRegister: 1, SetName: setNoEndpoints})...), rejectExpr(f, proto)))
		for _, p := range npReject {
			add(filterChains, "NodePorts without endpoints", append(append(append(slices.Clone(isTCP), nodePortExprs(f, p)...),
				append(keyExprs(f, false), &expr.Lookup{SourceRegister: 1, SetName: setNodePortNoEndpoints})...), rejectExpr(f, proto)))
		}
	}
	add(filterChains, "ClusterIPs: other ports", append(keyExprs(f, true)[:1:1],
		&expr.Lookup{SourceRegister: 1, SetName: setClusterIPs}, rejectExpr(f, "")))
	for _, p := range drops {
		add([]string{"filter-forward", "filter-output"}, "unallocated Service addresses",
			append(prefixExprs(f, p, false), &expr.Verdict{Kind: expr.VerdictDrop}))
		n++
	}
	return n
}

// listenerRules adds filter-input's refusal of new connections to a
// listener port whose conntrack entry was not destination-NATed: nat did
// not redirect them (a redirect sets the dnat status bit, with nftables and
// with iptables REDIRECT alike), so they came straight to <node address>:
// <port>, from outside as from the node. A TCP reset or ICMP port
// unreachable, as a port nothing listens on answers. Only a connection's
// first packets are looked at (ct state new): the node's established
// traffic passes after one comparison. Why a rule and not listeners on an
// address nothing routes to: test/bench/NOTES.md.
func (w *tableWriter) listenerRules() {
	notRedirected := []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitNEW), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(ipsDstNAT), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: make([]byte, 4)},
	}
	for _, proto := range []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP} {
		// The protocol first: the TCP rule's reset goes to TCP only.
		isProto := []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proxy.ProtocolNumber(proto)}}}
		w.add([]string{"filter-input"}, "listeners: only what kp redirected", append(append(append(isProto, notRedirected...),
			append(keyExprs(w.f, false), &expr.Lookup{SourceRegister: 1, SetName: setListeners})...), rejectExpr(w.f, proto)))
	}
}

// ipsDstNAT is IPS_DST_NAT, the conntrack status bit of a destination-NATed
// connection (include/uapi/linux/netfilter/nf_conntrack_common.h).
const ipsDstNAT = 1 << 5

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
