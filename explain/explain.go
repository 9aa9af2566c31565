package explain

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/kpproxy/kp/conntrack"
	"github.com/kpproxy/kp/proxy"
)

// RulePather is implemented per mode: the packet's path through that
// mode's rules (nftables: chains, rule handles, map elements; iptables:
// chains and rules; ipvs: the virtual server; userspace: the listener),
// told the explanation the model gives.
type RulePather interface {
	RulePath(m *Model, p Packet, e *Explanation) RulePath
}

// AffinityReader reads the mode's ClientIP session affinity entries (an
// nftables dynamic set, the iptables recent module's lists, IPVS
// persistence templates, the userspace balancers): client's entries for
// service port sp, and when the Expires of each was measured. An error
// says they are not known. A Model is one (its snapshot's entries).
type AffinityReader interface {
	PinnedEntries(sp proxy.ServicePortName, client netip.Addr) (entries []proxy.AffinityEntry, at time.Time, err error)
}

// Options are what Explain takes besides the model and the packet.
type Options struct {
	// RulePaths holds a RulePather per mode name; a mode without one
	// gets a RulePath whose Absent says so.
	RulePaths map[string]RulePather
	// Affinity reads pinned clients; nil: the Model's own entries (the
	// snapshot's).
	Affinity AffinityReader
	// Version is the explaining kp's version, noted when it differs from
	// the snapshot's.
	Version string
}

// Explain answers what kp does with packet p by the model m.
func Explain(m *Model, p Packet, o Options) *Explanation {
	e := &Explanation{Packet: p.String(), Mode: m.Mode, Conntrack: []ConntrackEntry{}}
	if m.Version != "" && o.Version != "" && m.Version != o.Version {
		e.note("the snapshot was taken by kp %s and is explained by kp %s: the answer follows this kp's rules", m.Version, o.Version)
	}
	ix := conntrack.NewIndex(m.State, slices.Concat(m.Facts.LocalAddrs, m.Facts.NodePortIPs))
	name, via, found := ix.Lookup(proxy.ProtocolNumber(p.Protocol), p.Dst)
	switch {
	case found && via == conntrack.ViaNodePort && !m.nodePortAddr(p.Dst.Addr()):
		sp := m.State.Services[name]
		e.notKPs(KindNone, fmt.Sprintf("%s is the NodePort of %s, but kp answers NodePorts only on %s", portString(sp.NodePort), name,
			addrList(m.nodePortAddrs())))
	case found:
		explainServicePort(e, m, p, m.State.Services[name], via, o)
	default:
		explainNoServicePort(e, m, p)
	}
	e.Conntrack, e.ConntrackError = flowEntries(m, p), m.ConntrackError
	e.RulePath = RulePath{Mode: m.Mode}
	if rp, ok := o.RulePaths[m.Mode]; ok {
		e.RulePath = rp.RulePath(m, p, e)
	} else {
		e.RulePath.Absent = fmt.Sprintf("the path through the %s mode's rules is not explained yet: the answer above is kp's model, "+
			"which every mode programs", modeName(m.Mode))
	}
	return e
}

func modeName(m string) string {
	if m == "" {
		return "running"
	}
	return m
}

func (e *Explanation) note(format string, args ...any) {
	e.Notes = append(e.Notes, fmt.Sprintf(format, args...))
}

func (e *Explanation) notKPs(kind, why string) {
	e.Verdict, e.Address = VerdictNotKPs, Address{Kind: kind, Detail: why}
	e.Why = "no Service here: the packet is not kp's (" + why + "); routing and the node's own sockets decide"
}

// nodePortAddrs are where NodePorts answer: the snapshot's NodePortIPs,
// else (a snapshot without them) the Node's IPs.
func (m *Model) nodePortAddrs() []netip.Addr {
	if len(m.Facts.NodePortIPs) > 0 {
		return m.Facts.NodePortIPs
	}
	return m.State.Node.IPs
}

func (m *Model) nodePortAddr(a netip.Addr) bool { return slices.Contains(m.nodePortAddrs(), a) }

// explainNoServicePort answers for an address and port no Service port
// has: a ClusterIP's other port (rejected), an unallocated address of a
// Service CIDR (dropped), an IP family the node does not run, or nothing
// of kp's.
func explainNoServicePort(e *Explanation, m *Model, p Packet) {
	dst := p.Dst.Addr()
	fam := proxy.FamilyOf(dst)
	if !m.hasFamily(fam) {
		e.notKPs(KindNone, fmt.Sprintf("this node has no %s address and no Service of that family: kp programs no %s rules here", fam, fam))
		return
	}
	if sp, ports := m.ownerOf(dst, func(sp *proxy.ServicePort) []netip.Addr { return sp.ClusterIPs }); sp != nil {
		e.Verdict, e.Reject = VerdictReject, rejectHow(p)
		e.Address = Address{Kind: KindClusterIP, Detail: fmt.Sprintf("%s is the ClusterIP of %s/%s, which has no %s port %d (its ports: %s)",
			dst, sp.Name.Namespace, sp.Name.Name, p.Protocol, p.Dst.Port(), ports)}
		e.Why = "a port the Service lacks: kp rejects it (" + e.Reject + ") rather than let it wait for a timeout"
		return
	}
	for _, field := range []struct {
		kind  string
		addrs func(*proxy.ServicePort) []netip.Addr
	}{{KindExternalIP, func(sp *proxy.ServicePort) []netip.Addr { return sp.ExternalIPs }},
		{KindLoadBalancerIP, func(sp *proxy.ServicePort) []netip.Addr { return sp.LoadBalancerIPs }}} {
		if sp, ports := m.ownerOf(dst, field.addrs); sp != nil {
			e.notKPs(KindNone, fmt.Sprintf("%s is an %s of %s/%s, but not for %s port %d (its ports: %s); kp leaves the others alone",
				dst, field.kind, sp.Name.Namespace, sp.Name.Name, p.Protocol, p.Dst.Port(), ports))
			return
		}
	}
	for _, c := range m.State.ServiceCIDRs {
		if c.Contains(dst) {
			e.Verdict, e.Address = VerdictDrop, Address{Kind: KindServiceCIDR,
				Detail: fmt.Sprintf("%s is in the Service CIDR %s, and no Service has it", dst, c)}
			e.Why = "an unallocated ClusterIP: kp drops it, so it cannot leave the node towards a default route"
			return
		}
	}
	if m.nodePortAddr(dst) {
		e.notKPs(KindNone, fmt.Sprintf("%s is a node address NodePorts answer on, but no Service has %s NodePort %d", dst, p.Protocol, p.Dst.Port()))
		return
	}
	e.notKPs(KindNone, fmt.Sprintf("no Service has %s, %s port %d", dst, p.Protocol, p.Dst.Port()))
}

// hasFamily reports whether the node runs family f: a node address, a
// Service CIDR or a Service address of f.
func (m *Model) hasFamily(f proxy.Family) bool {
	if len(proxy.FilterAddrs(f, m.State.Node.IPs)) > 0 || len(proxy.FilterPrefixes(f, m.State.ServiceCIDRs)) > 0 {
		return true
	}
	for _, sp := range m.State.Services {
		if len(proxy.FilterAddrs(f, sp.ClusterIPs)) > 0 {
			return true
		}
	}
	return false
}

// ownerOf finds a Service port with a among addrs(sp), and lists that
// Service's ports at a ("TCP 80, UDP 53").
func (m *Model) ownerOf(a netip.Addr, addrs func(*proxy.ServicePort) []netip.Addr) (*proxy.ServicePort, string) {
	var owner *proxy.ServicePort
	var ports []string
	for _, sp := range m.State.Services {
		if !slices.Contains(addrs(sp), a) {
			continue
		}
		if owner == nil || sp.Name.String() < owner.Name.String() {
			owner = sp
		}
		ports = append(ports, fmt.Sprintf("%s %d", sp.Protocol, sp.Port))
	}
	sort.Strings(ports)
	return owner, strings.Join(ports, ", ")
}

// rejectHow is how kp's modes refuse a connection: TCP with a reset,
// anything else with ICMP port unreachable.
func rejectHow(p Packet) string {
	if proxy.ProtocolNumber(p.Protocol) == proxy.ProtocolNumberTCP {
		return "TCP reset"
	}
	return "ICMP port unreachable"
}

// flowEntries are m's conntrack entries of p's flow.
func flowEntries(m *Model, p Packet) []ConntrackEntry {
	out := []ConntrackEntry{}
	proto := strings.ToLower(string(p.Protocol))
	for _, c := range m.Conntrack {
		if c.Protocol != proto || c.OrigDst != p.Dst.String() {
			continue
		}
		if src, err := netip.ParseAddrPort(c.OrigSrc); p.Src.IsValid() && (err != nil || src.Addr() != p.Src ||
			(p.SrcPort != 0 && src.Port() != p.SrcPort)) {
			continue
		}
		out = append(out, ConntrackEntry(c))
	}
	return out
}

func addrList(as []netip.Addr) string {
	if len(as) == 0 {
		return "no address"
	}
	ss := make([]string, len(as))
	for i, a := range as {
		ss[i] = a.String()
	}
	return strings.Join(ss, ", ")
}
