package fromkubeproxy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/conntrack"
	"github.com/kpproxy/kp/proxy"
)

// nodeFacts is what the API server says of a node that the items need.
type nodeFacts struct {
	name string
	// listed are the Node's addresses, InternalIP first (proxy.NodeFrom);
	// primary upstream's node IPs, the first of each family.
	listed, primary []netip.Addr
	podCIDRs        []netip.Prefix
	cpus            int64
	addressText     []string
	podCIDRText     []string
}

func factsOf(nodes []v1.Node) []nodeFacts {
	var out []nodeFacts
	for i := range nodes {
		n := &nodes[i]
		pn, _ := proxy.NodeFrom(n.Name, n)
		f := nodeFacts{name: n.Name, listed: pn.IPs, cpus: n.Status.Capacity.Cpu().Value()}
		for _, fam := range []proxy.Family{proxy.IPv4, proxy.IPv6} {
			if a, ok := pn.PrimaryIP(fam); ok {
				f.primary = append(f.primary, a)
			}
		}
		for _, a := range n.Status.Addresses {
			if a.Type == v1.NodeInternalIP || a.Type == v1.NodeExternalIP {
				f.addressText = append(f.addressText, string(a.Type)+" "+a.Address)
			}
		}
		cidrs := n.Spec.PodCIDRs
		if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
			cidrs = []string{n.Spec.PodCIDR}
		}
		f.podCIDRText = cidrs
		f.podCIDRs, _ = parsePrefixes(cidrs)
		out = append(out, f)
	}
	return out
}

func (p *preflight) localhostNodePorts(n nodeFacts) Item {
	it := Item{ID: "localhost-nodeports", Severity: SeverityOK}
	kp := p.kp.localhost()
	it.KubeProxy, it.KP = "does not answer NodePorts on 127.0.0.1", "does not answer NodePorts on 127.0.0.1"
	if p.u.localhost {
		it.KubeProxy = "answers IPv4 NodePorts on 127.0.0.1 too (iptables mode, iptables.localhostNodePorts: route_localnet=1)"
	}
	if kp {
		it.KP = "answers IPv4 NodePorts on 127.0.0.1 too"
	} else if p.u.localhost {
		it.KP += " (" + map[proxy.Mode]string{proxy.ModeNFTables: "nftables cannot DNAT loopback", proxy.ModeIPVS: "ipvs makes no virtual server on loopback",
			proxy.ModeIPTables: "iptables.localhostNodePorts false, or NodePorts not on every address", proxy.ModeUserspace: "its NodePort addresses hold no loopback"}[p.kp.target.Mode] + ")"
	}
	hasV4 := len(n.listed) == 0 || slices.ContainsFunc(n.listed, netip.Addr.Is4)
	switch {
	case !hasV4:
		it.KP += "; the node has no IPv4 address, and localhost NodePorts are IPv4 only"
	case p.u.localhost && !kp:
		it.Severity = SeverityWarning
		it.Action = "clients on the node that dial 127.0.0.1:NODEPORT (or localhost) are refused: have them dial the node's IP or the ClusterIP " +
			"(kube-proxy's route_localnet=1 stays set until the node reboots)"
	case kp && !p.u.localhost:
		it.Severity = SeverityInfo
	}
	return it
}

// nodePortSet is where NodePorts answer on a node: listed addresses of the
// Node, and whether other local addresses too (all of them, or the ones in
// cidrs).
type nodePortSet struct {
	listed []netip.Addr
	all    bool
	cidrs  []netip.Prefix
}

func nodePortsOn(n nodeFacts, primary []netip.Addr, isPrimary bool, cidrs []netip.Prefix) nodePortSet {
	switch {
	case isPrimary:
		return nodePortSet{listed: primary}
	case len(cidrs) > 0:
		s := nodePortSet{cidrs: cidrs}
		for _, a := range n.listed {
			if slices.ContainsFunc(cidrs, func(p netip.Prefix) bool { return p.Contains(a) }) {
				s.listed = append(s.listed, a)
			}
		}
		return s
	}
	return nodePortSet{listed: n.listed, all: true}
}

func (s nodePortSet) String() string {
	out := "answers NodePorts on " + orNone(joinAddrs(s.listed))
	switch {
	case s.all:
		out += " and every other local address"
	case len(s.cidrs) > 0:
		out += fmt.Sprintf(" and other local addresses in %v", s.cidrs)
	}
	return out
}

// covers says whether s answers wherever o does, other local addresses
// included.
func (s nodePortSet) covers(o nodePortSet) bool {
	for _, a := range o.listed {
		if !slices.Contains(s.listed, a) {
			return false
		}
	}
	switch {
	case s.all || (!o.all && len(o.cidrs) == 0):
		return true
	case o.all:
		return false
	}
	for _, p := range o.cidrs {
		if !slices.ContainsFunc(s.cidrs, func(q netip.Prefix) bool { return q.Bits() <= p.Bits() && q.Contains(p.Addr()) }) {
			return false
		}
	}
	return true
}

func (p *preflight) nodePortAddresses(n nodeFacts) Item {
	kube := nodePortsOn(n, n.primary, p.u.nodePortPrimary, p.u.nodePortCIDRs)
	kpPrimary, kpCIDRs := p.kp.nodePorts()
	kp := nodePortsOn(n, n.listed, kpPrimary, kpCIDRs)
	it := Item{ID: "nodeport-addresses", Severity: SeverityOK, KubeProxy: kube.String() + nodePortWhy(p.u.mode, p.u.nodePortPrimary, p.u.nodePortCIDRs),
		KP: kp.String() + nodePortWhy(p.kp.target.Mode, kpPrimary, kpCIDRs)}
	switch {
	case !kp.covers(kube):
		it.Severity = SeverityWarning
		it.Action = "NodePort traffic to the addresses kp drops is refused; to answer on every local address as kube-proxy did, " +
			`set nodePortAddresses: ["0.0.0.0/0", "::/0"] in kp's configuration`
	case !kube.covers(kp):
		it.Severity = SeverityInfo
	}
	return it
}

func nodePortWhy(mode proxy.Mode, primary bool, cidrs []netip.Prefix) string {
	switch {
	case len(cidrs) > 0:
		return " (nodePortAddresses)"
	case primary && mode == proxy.ModeNFTables:
		return " (the nftables mode's default: the node's primary IPs)"
	case primary:
		return " (nodePortAddresses: primary)"
	}
	return " (the " + string(mode) + " mode's default)"
}

// clusterCIDR: who counts as a pod on n, which kp asks its clusterCIDR
// only in detectLocalMode ClusterCIDR.
func (p *preflight) clusterCIDR(n nodeFacts) Item {
	kp := p.kp.s.Config.ClusterCIDRs
	var kube []netip.Prefix
	it := Item{ID: "cluster-cidr", Severity: SeverityOK, KP: "pods are " + orNone(prefixes(kp)) + " (clusterCIDR)"}
	switch p.u.detectLocalMode {
	case "ClusterCIDR":
		kube = p.u.clusterCIDRs
		it.KubeProxy = "pods are " + orNone(prefixes(kube)) + " (clusterCIDR)"
	case "NodeCIDR":
		kube = n.podCIDRs
		it.KubeProxy = "pods are this node's podCIDRs, " + orNone(prefixes(kube)) + " (detectLocalMode NodeCIDR)"
	default:
		it.KubeProxy = "pods are what comes in on their interfaces (detectLocalMode " + p.u.detectLocalMode + ")"
	}
	if l := p.kp.local(); l.mode != proxy.LocalModeClusterCIDR {
		return podsWithoutClusterCIDR(it, n, l)
	}
	hint, from := clusterCIDRHint(p.c)
	set := "set clusterCIDR to the cluster's pod CIDR(s) in kp's configuration"
	if hint != "" {
		set = "set clusterCIDR: " + hint + " in kp's configuration (" + from + ")"
	}
	uncovered := slices.DeleteFunc(slices.Clone(n.podCIDRs), func(pc netip.Prefix) bool {
		return slices.ContainsFunc(kp, func(q netip.Prefix) bool { return q.Bits() <= pc.Bits() && q.Contains(pc.Addr()) })
	})
	switch {
	case len(kp) == 0:
		it.KP = "cannot tell pods from other clients (no clusterCIDR): traffic to a ClusterIP from outside the cluster is not masqueraded, " +
			"and pods reach externalTrafficPolicy: Local Services' external addresses only through their own node's endpoints"
		it.Severity, it.Action = SeverityWarning, set
		if len(kube) == 0 && p.u.detectLocalMode == "ClusterCIDR" {
			it.Severity = SeverityInfo // as kube-proxy: the same, and worth fixing
		}
	case len(uncovered) > 0:
		it.Severity, it.Action = SeverityWarning, set
		it.KP += fmt.Sprintf(": this node's pods (%s) are outside it, so kp takes them for clients from outside the cluster", prefixes(uncovered))
	case !slices.Equal(kp, kube):
		it.Severity = SeverityInfo
		if len(n.podCIDRs) == 0 {
			it.Action = "the Node has no podCIDR (the CNI allocates addresses): check clusterCIDR holds its pods' addresses"
		}
	}
	return it
}

// podsWithoutClusterCIDR is the cluster-cidr item when kp tells pods
// another way (l): clusterCIDR does not matter; in NodeCIDR mode kp needs
// the node's podCIDRs to start (cmd/kp waits for them, as upstream).
func podsWithoutClusterCIDR(it Item, n nodeFacts, l localMode) Item {
	it.KP = "tells pods by " + l.String() + ", not by clusterCIDR"
	if l.mode != proxy.LocalModeNodeCIDR {
		return it
	}
	it.KP = "pods are this node's podCIDRs, " + orNone(prefixes(n.podCIDRs)) + " (detectLocalMode NodeCIDR), not clusterCIDR"
	if len(n.podCIDRs) == 0 {
		it.Severity = SeverityError
		it.KP = "waits at start for the Node's podCIDRs (detectLocalMode NodeCIDR), and exits without them after 5 minutes: the Node has none"
		it.Action = "give the node podCIDRs (kube-controller-manager --allocate-node-cidrs), or set another detectLocalMode in kp's configuration"
	}
	return it
}

func (p *preflight) conntrack(n nodeFacts) Item {
	kube, kp := p.u.conntrack, p.kp.s.Conntrack
	it := Item{ID: "conntrack", Severity: SeverityOK, KubeProxy: "sets " + tuningText(kube, n.cpus), KP: "sets " + tuningText(kp, n.cpus)}
	if kube != kp {
		it.Severity = SeverityWarning
		it.Action = "kp's DaemonSet sets kp's values when it starts (its init container, kp sysctl); a value kp leaves as is keeps what kube-proxy set " +
			"until the node reboots; --print-config writes kube-proxy's conntrack section"
	}
	return it
}

// tuningText is what t sets on a node with cpus CPUs.
func tuningText(t conntrack.Tuning, cpus int64) string {
	var parts []string
	switch {
	case t.MaxPerCore == 0:
		parts = append(parts, "no nf_conntrack_max (left as is)")
	case cpus > 0:
		parts = append(parts, fmt.Sprintf("nf_conntrack_max %d (%d per CPU × %d, at least %d)", max(int64(t.MaxPerCore)*cpus, int64(t.Min)), t.MaxPerCore, cpus, t.Min))
	default:
		parts = append(parts, fmt.Sprintf("nf_conntrack_max %d per CPU, at least %d", t.MaxPerCore, t.Min))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"tcp_timeout_established", t.TCPEstablishedTimeout}, {"tcp_timeout_close_wait", t.TCPCloseWaitTimeout},
		{"udp_timeout", t.UDPTimeout}, {"udp_timeout_stream", t.UDPStreamTimeout},
	} {
		if d.v != 0 {
			parts = append(parts, fmt.Sprintf("%s %ds", d.name, int64(d.v/time.Second)))
		}
	}
	if t.TCPBeLiberal {
		parts = append(parts, "tcp_be_liberal 1")
	}
	return strings.Join(parts, ", ")
}

func joinAddrs(as []netip.Addr) string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return strings.Join(s, ", ")
}

func prefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ", ")
}
