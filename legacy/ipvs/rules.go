package ipvs

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/kpproxy/kp/legacy/iptables"
	"github.com/kpproxy/kp/proxy"
)

// kp's ipvs-mode chains: upstream's ipvs-mode chains under KP-IPVS-, a
// prefix the iptables mode neither writes nor removes.
const (
	chainServices     = iptables.IPVSChainPrefix + "SERVICES"
	chainPostrouting  = iptables.IPVSChainPrefix + "POSTROUTING"
	chainMarkMasq     = iptables.IPVSChainPrefix + "MARK-MASQ"
	chainNodePort     = iptables.IPVSChainPrefix + "NODE-PORT"
	chainLoadBalancer = iptables.IPVSChainPrefix + "LOAD-BALANCER"
	chainForward      = iptables.IPVSChainPrefix + "FORWARD"
	chainFirewall     = iptables.IPVSChainPrefix + "PROXY-FIREWALL"
	chainSourceRanges = iptables.IPVSChainPrefix + "SOURCE-RANGES-FW"
	chainFilter       = iptables.IPVSChainPrefix + "FILTER"
	chainServiceCIDRs = iptables.IPVSChainPrefix + "SERVICE-CIDRS"
)

// jump is a rule of a built-in chain leading to one of kp's.
type jump struct {
	table    iptables.Table
	from, to string
	comment  string
}

var jumps = []jump{
	{iptables.TableNAT, "PREROUTING", chainServices, "kp ipvs service portals"},
	{iptables.TableNAT, "OUTPUT", chainServices, "kp ipvs service portals"},
	{iptables.TableNAT, "POSTROUTING", chainPostrouting, "kp ipvs postrouting rules"},
	{iptables.TableFilter, "FORWARD", chainForward, "kp ipvs forwarding rules"},
	{iptables.TableFilter, "INPUT", chainNodePort, "kp ipvs health check rules"},
	{iptables.TableFilter, "INPUT", chainFirewall, "kp ipvs firewall rules"},
	{iptables.TableFilter, "FORWARD", chainFirewall, "kp ipvs firewall rules"},
	{iptables.TableFilter, "INPUT", chainFilter, "kp ipvs access filter"},
	{iptables.TableFilter, "FORWARD", chainServiceCIDRs, "kp ipvs unallocated service addresses"},
	{iptables.TableFilter, "OUTPUT", chainServiceCIDRs, "kp ipvs unallocated service addresses"},
}

func (j jump) line() string {
	return fmt.Sprintf("-I %s -m comment --comment %q -j %s", j.from, j.comment, j.to)
}

// rulesInput is what the chains depend on.
type rulesInput struct {
	family        proxy.Family
	masqMark      uint32
	masqueradeAll bool
	// notLocal matches what is not local traffic (iptables.LocalMatch),
	// empty when local traffic cannot be told.
	notLocal string
	// serviceCIDRs: traffic to an address of them that no Service holds
	// is dropped (kp's other modes do so; upstream's ipvs mode does not).
	serviceCIDRs []netip.Prefix
}

// renderChains builds the ipvs mode's chains, as upstream's ipvs mode
// writes them. Unlike upstream, a rule matching a set is written whether
// the set is empty or not, so the chains depend only on the configuration
// and are written once (at a full sync), not at every Service change.
func renderChains(in rulesInput) []*iptables.Chain {
	f := in.family
	set := func(k setKind) string { return setName(f, k) }
	mark := fmt.Sprintf("0x%x", in.masqMark)
	nat, filter := iptables.TableNAT, iptables.TableFilter
	r := func(comment, args string, a ...any) iptables.Rule {
		return iptables.Rule{Comment: comment, Args: fmt.Sprintf(args, a...)}
	}
	var out []*iptables.Chain
	add := func(t iptables.Table, name string, rules ...iptables.Rule) {
		out = append(out, &iptables.Chain{Table: t, Name: name, Rules: rules})
	}

	// nat KP-IPVS-SERVICES: mark what needs masquerading; the rest of the
	// work is IPVS's, in the INPUT and OUTPUT hooks.
	svc := []iptables.Rule{
		r("load balancer ingress", "-m set --match-set %s dst,dst -j %s", set(setLoadBalancer), chainLoadBalancer),
	}
	switch {
	case in.masqueradeAll:
		svc = append(svc, r("ClusterIPs, masquerade all", "-m set --match-set %s dst,dst -j %s", set(setClusterIP), chainMarkMasq))
	case in.notLocal != "":
		svc = append(svc, r("ClusterIPs from outside the cluster", "%s -m set --match-set %s dst,dst -j %s", in.notLocal, set(setClusterIP), chainMarkMasq))
	default:
		// Without a cluster CIDR (or pod CIDR), masquerade the node's own connections,
		// whose source is the ClusterIP (kp-ipvs0 holds it), as upstream.
		svc = append(svc, r("ClusterIPs from the node", "-m set --match-set %s src,dst -j %s", set(setClusterIP), chainMarkMasq))
	}
	svc = append(svc,
		r("externalIPs", "-m set --match-set %s dst,dst -j %s", set(setExternalIP), chainMarkMasq),
		r("externalIPs", "-m set --match-set %s dst,dst -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT", set(setExternalIP)),
		r("externalIPs", "-m set --match-set %s dst,dst -m addrtype --dst-type LOCAL -j ACCEPT", set(setExternalIP)),
		r("externalIPs, local policy", "-m set --match-set %s dst,dst -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT", set(setExternalIPLocal)),
		r("externalIPs, local policy", "-m set --match-set %s dst,dst -m addrtype --dst-type LOCAL -j ACCEPT", set(setExternalIPLocal)),
		r("NodePorts", "-m addrtype --dst-type LOCAL -j %s", chainNodePort),
		// IPVS's NodePorts are left to IPVS, as its ClusterIPs below:
		// upstream falls through here, but while a switch from kp's
		// iptables mode has both modes' chains in one nat table, the
		// iptables mode's DNAT after these would take them (a switch
		// into ipvs failed its verify on a UDP NodePort, in the VM).
		r("NodePorts", "-p tcp -m addrtype --dst-type LOCAL -m set --match-set %s dst -j ACCEPT", set(setNodePortTCP)),
		r("NodePorts", "-p udp -m addrtype --dst-type LOCAL -m set --match-set %s dst -j ACCEPT", set(setNodePortUDP)),
		r("NodePorts", "-p sctp -m addrtype --dst-type LOCAL -m set --match-set %s dst,dst -j ACCEPT", set(setNodePortSCTP)),
		r("NodePorts", "-p sctp -m addrtype --dst-type LOCAL -m set --match-set %s dst,dst -j ACCEPT", set(setNodePortLocalSCTP)),
		r("", "-m set --match-set %s dst,dst -j ACCEPT", set(setClusterIP)),
		r("", "-m set --match-set %s dst,dst -j ACCEPT", set(setLoadBalancer)),
	)
	add(nat, chainServices, svc...)
	add(nat, chainNodePort,
		r("", "-p tcp -m set --match-set %s dst -j RETURN", set(setNodePortLocalTCP)),
		r("", "-p tcp -m set --match-set %s dst -j %s", set(setNodePortTCP), chainMarkMasq),
		r("", "-p udp -m set --match-set %s dst -j RETURN", set(setNodePortLocalUDP)),
		r("", "-p udp -m set --match-set %s dst -j %s", set(setNodePortUDP), chainMarkMasq),
		r("", "-p sctp -m set --match-set %s dst,dst -j RETURN", set(setNodePortLocalSCTP)),
		r("", "-p sctp -m set --match-set %s dst,dst -j %s", set(setNodePortSCTP), chainMarkMasq),
	)
	add(nat, chainLoadBalancer,
		r("", "-m set --match-set %s dst,dst -j RETURN", set(setLoadBalancerLocal)),
		r("", "-j %s", chainMarkMasq),
	)
	add(nat, chainPostrouting,
		r("hairpin", "-m set --match-set %s dst,dst,src -j MASQUERADE", set(setLoopBack)),
		r("", "-m mark ! --mark %s/%s -j RETURN", mark, mark),
		r("", "-j MARK --xor-mark %s", mark),
		r("kp ipvs service traffic requiring SNAT", "-j MASQUERADE --random-fully"),
	)
	add(nat, chainMarkMasq, r("", "-j MARK --or-mark %s", mark))

	add(filter, chainForward,
		r("kp forwarding rules", "-m mark --mark %s/%s -j ACCEPT", mark, mark),
		r("kp forwarding conntrack rule", "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"),
	)
	add(filter, chainNodePort, r("health check node ports", "-m set --match-set %s dst -j ACCEPT", set(setHealthCheck)))
	add(filter, chainFirewall, r("loadBalancerSourceRanges", "-m set --match-set %s dst,dst -j %s", set(setLoadBalancerFW), chainSourceRanges))
	add(filter, chainSourceRanges,
		r("", "-m set --match-set %s dst,dst,src -j RETURN", set(setLBSourceCIDR)),
		r("", "-m set --match-set %s dst,dst,src -j RETURN", set(setLBSourceIP)),
		r("", "-j DROP"),
	)
	// The Service addresses are local (kp-ipvs0 holds them): without this,
	// ClusterIP:22 would reach the node's sshd (kubernetes#72236).
	add(filter, chainFilter,
		r("", "-m set --match-set %s dst,dst -j RETURN", set(setLoadBalancer)),
		r("", "-m set --match-set %s dst,dst -j RETURN", set(setClusterIP)),
		r("", "-m set --match-set %s dst,dst -j RETURN", set(setExternalIP)),
		r("", "-m set --match-set %s dst,dst -j RETURN", set(setExternalIPLocal)),
		r("", "-m set --match-set %s dst -j RETURN", set(setHealthCheck)),
		r("other ports of Service addresses", "-m conntrack --ctstate NEW -m set --match-set %s dst -j REJECT", set(setIPVSIPs)),
	)
	var cidrs []iptables.Rule
	for _, c := range proxy.FilterPrefixes(f, in.serviceCIDRs) {
		cidrs = append(cidrs, r("unallocated service address", "-d %s -m set ! --match-set %s dst -j DROP", c, set(setIPVSIPs)))
	}
	add(filter, chainServiceCIDRs, cidrs...)
	return out
}

// restoreInput is the iptables-restore input writing chains, with the
// jumps the kernel lacks (saved: each table's iptables-save).
func restoreInput(chains []*iptables.Chain, saved map[iptables.Table]*iptables.Dump) []byte {
	var b strings.Builder
	for _, t := range []iptables.Table{iptables.TableNAT, iptables.TableFilter} {
		b.WriteString("*" + string(t) + "\n")
		for _, c := range chains {
			if c.Table == t {
				b.WriteString(":" + c.Name + " - [0:0]\n")
			}
		}
		for _, c := range chains {
			if c.Table != t {
				continue
			}
			for _, r := range c.Rules {
				b.WriteString(r.Line(c.Name) + "\n")
			}
		}
		for _, j := range jumps {
			if j.table == t && !hasJump(saved[t], j) {
				b.WriteString(j.line() + "\n")
			}
		}
		b.WriteString("COMMIT\n")
	}
	return []byte(b.String())
}

// hasJump reports whether the saved table has j (its target and comment).
func hasJump(d *iptables.Dump, j jump) bool {
	if d == nil {
		return false
	}
	for _, r := range d.Rules[j.from] {
		if iptables.RuleTarget(r.Spec) == j.to && strings.Contains(r.Spec, j.comment) {
			return true
		}
	}
	return false
}
