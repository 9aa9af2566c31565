package iptables

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/kpproxy/kp/proxy"
)

// jump is a rule in a built-in chain that leads to one of kp's chains, as
// upstream's iptablesJumpChains. kp inserts them first in the built-in
// chain; a full sync checks they are there (iptables-save) and adds the
// missing ones.
type jump struct {
	table   Table
	from    string
	to      string
	comment string
	extra   string // matches before the comment
}

// spec is the jump as "-I FROM 1" input.
func (j jump) line() string {
	r := Rule{Comment: j.comment, Args: "-j " + j.to}
	s := r.line(j.from)[len("-A "+j.from):]
	if j.extra != "" {
		s = " " + j.extra + s
	}
	return "-I " + j.from + " 1" + s
}

const ctNew = "-m conntrack --ctstate NEW"

// retiredJumps are jumps kp no longer writes: a full sync deletes them, so
// a node upgraded from a kp that wrote them loses them at its first sync
// (as upstream's iptablesCleanupOnlyChains).
//
// filter INPUT → KP-SERVICES: upstream's iptables mode has no such jump
// (removed by kubernetes#95252), and kp's refused what another proxy of
// the node serves as a local address ahead of this mode's DNAT: in a
// switch to the ipvs mode, whose nat accept runs first, new connections
// to a ClusterIP met "cluster IP: other ports" REJECT on their way in.
var retiredJumps = []jump{
	{TableFilter, "INPUT", chainServices, "kubernetes service portals", ctNew},
}

func (b *Backend) jumps(fam proxy.Family) []jump {
	js := []jump{
		{TableFilter, "INPUT", chainExternalServices, "kubernetes externally-visible service portals", ctNew},
		{TableFilter, "FORWARD", chainExternalServices, "kubernetes externally-visible service portals", ctNew},
		{TableFilter, "INPUT", chainNodePorts, "kubernetes health check service ports", ""},
		{TableFilter, "FORWARD", chainServices, "kubernetes service portals", ctNew},
		{TableFilter, "OUTPUT", chainServices, "kubernetes service portals", ctNew},
		{TableFilter, "FORWARD", chainForward, "kubernetes forwarding rules", ""},
		{TableFilter, "INPUT", chainProxyFirewall, "kubernetes load balancer firewall", ctNew},
		{TableFilter, "OUTPUT", chainProxyFirewall, "kubernetes load balancer firewall", ctNew},
		{TableFilter, "FORWARD", chainProxyFirewall, "kubernetes load balancer firewall", ctNew},
		{TableNAT, "OUTPUT", chainServices, "kubernetes service portals", ""},
		{TableNAT, "PREROUTING", chainServices, "kubernetes service portals", ""},
		{TableNAT, "POSTROUTING", chainPostrouting, "kubernetes postrouting rules", ""},
	}
	if fam == proxy.IPv4 && b.localhostNodePorts {
		js = append(js,
			jump{TableFilter, "INPUT", chainFirewall, "kp firewall for localhost NodePorts", ""},
			jump{TableFilter, "OUTPUT", chainFirewall, "kp firewall for localhost NodePorts", ""})
	}
	return js
}

// skeleton returns every shared chain of family fam: the static ones and
// the dispatch tries built from every service port's entries.
func (b *Backend) skeleton(fam proxy.Family, svcs map[proxy.ServicePortName]*rendered, nodePortDsts []string, serviceCIDRs []netip.Prefix) []*Chain {
	var natSvc, natNP, fSvc, fExt, fFW []entry
	var health []Rule
	for _, r := range svcs {
		natSvc = append(natSvc, r.natServices...)
		natNP = append(natNP, r.natNodePorts...)
		fSvc = append(fSvc, r.filterServices...)
		fExt = append(fExt, r.filterExternal...)
		fFW = append(fFW, r.firewall...)
		health = append(health, r.healthChecks...)
	}
	slices.SortFunc(health, func(a, c Rule) int { return compareNames(a.Owner, c.Owner) })
	var out []*Chain
	add := func(t Table, name string, rules []Rule, sub []*Chain) {
		out = append(out, &Chain{Table: t, Name: name, Rules: rules})
		out = append(out, sub...)
	}

	mark := fmt.Sprintf("%#x", b.masqMark)
	masq := "-j MASQUERADE --random-fully"
	add(TableNAT, chainPostrouting, []Rule{
		{Args: fmt.Sprintf("-m mark ! --mark %s/%s -j RETURN", mark, mark)},
		{Args: "-j MARK --xor-mark " + mark},
		{Comment: "kubernetes service traffic requiring SNAT", Args: masq},
	}, nil)
	add(TableNAT, chainMarkMasq, []Rule{{Args: "-j MARK --or-mark " + mark}}, nil)

	rules, sub := addrTree(TableNAT, fam, "KP-SVCS", natSvc)
	for _, d := range nodePortDsts {
		rules = append(rules, Rule{Comment: "kubernetes service nodeports; NOTE: this must be the last rule in this chain",
			Args: d + " -j " + chainNodePorts})
	}
	add(TableNAT, chainServices, rules, sub)
	rules, sub = portTree(TableNAT, fam, "KP-NPS", natNP)
	add(TableNAT, chainNodePorts, rules, sub)

	rules, sub = addrTree(TableFilter, fam, "KP-FSVCS", fSvc)
	for _, p := range serviceCIDRs {
		rules = append(rules, Rule{Comment: "unallocated address of service CIDR " + p.String(), Args: "-d " + p.String() + " -j DROP"})
	}
	add(TableFilter, chainServices, rules, sub)
	var addrs, ports []entry
	for _, e := range fExt {
		if e.proto != "" {
			ports = append(ports, e)
		} else {
			addrs = append(addrs, e)
		}
	}
	rules, sub = addrTree(TableFilter, fam, "KP-FEXT", addrs)
	prules, psub := portTree(TableFilter, fam, "KP-FEXTP", ports)
	add(TableFilter, chainExternalServices, append(rules, prules...), append(sub, psub...))
	rules, sub = addrTree(TableFilter, fam, "KP-FFW", fFW)
	add(TableFilter, chainProxyFirewall, rules, sub)
	add(TableFilter, chainNodePorts, health, nil)
	add(TableFilter, chainForward, []Rule{
		{Args: "-m conntrack --ctstate INVALID -j DROP"},
		{Comment: "kubernetes forwarding rules", Args: fmt.Sprintf("-m mark --mark %s/%s -j ACCEPT", mark, mark)},
		{Comment: "kubernetes forwarding conntrack rule", Args: "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"},
	}, nil)
	if fam == proxy.IPv4 && b.localhostNodePorts {
		// route_localnet opens 127.0.0.0/8 to other hosts
		// (https://issue.k8s.io/90259): as upstream and the kubelet,
		// drop what arrives from outside for it.
		add(TableFilter, chainFirewall, []Rule{{Comment: "block incoming localnet connections",
			Args: "-d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP"}}, nil)
	}
	return out
}

// nodePortDestinations are the matches of KP-SERVICES' last rules, which
// send NodePort traffic to KP-NODEPORTS: with "primary" (kp's default in
// every mode), the Node's primary IPs; with CIDRs, the local addresses
// inside them; with a /0 of the family or no setting at all (upstream's
// iptables default), every local address (`-m addrtype --dst-type LOCAL`,
// as upstream: it follows addresses added later; localhost only with
// --iptables-localhost-nodeports, IPv4 only).
func (b *Backend) nodePortDestinations(fam proxy.Family, node proxy.Node) []string {
	all := func() []string {
		d := "-m addrtype --dst-type LOCAL"
		switch {
		case fam == proxy.IPv6:
			d += " ! -d ::1/128"
		case !b.localhostNodePorts:
			d += " ! -d 127.0.0.0/8"
		}
		return []string{d}
	}
	var ips []netip.Addr
	switch {
	case b.cfg.NodePortPrimary:
		ips = proxy.FilterAddrs(fam, node.IPs)
		if len(ips) == 0 {
			if b.warnedPrimary[fam] {
				return all()
			}
			b.warnedPrimary[fam] = true
			b.log.Warn("--nodeport-addresses primary: the Node has no IP of this family yet; NodePorts answer on every local address", "family", fam)
			return all()
		}
		b.warnedPrimary[fam] = false
	case slices.ContainsFunc(proxy.FilterPrefixes(fam, b.cfg.NodePortAddresses), func(p netip.Prefix) bool { return p.Bits() == 0 }):
		return all()
	case len(b.cfg.NodePortAddresses) > 0:
		local, err := b.localAddrs()
		if err != nil {
			b.log.Warn("cannot list this node's addresses for --nodeport-addresses", "err", err)
		}
		for _, a := range proxy.FilterAddrs(fam, local) {
			for _, p := range b.cfg.NodePortAddresses {
				if !p.Contains(a) {
					continue
				}
				if a.IsLoopback() && (fam == proxy.IPv6 || !b.localhostNodePorts) {
					break
				}
				ips = append(ips, a)
				break
			}
		}
	default:
		return all()
	}
	var out []string
	for _, a := range ips {
		out = append(out, "-d "+a.String())
	}
	return out
}
