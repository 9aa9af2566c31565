package iptables

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/kpproxy/kp/proxy"
)

// rendered is everything one service port contributes to one family's
// tables: its own nat chains (KP-SVC-, KP-SVL-, KP-EXT-, KP-FW-, KP-SEP-),
// and the rules it adds to kp's shared dispatch chains, keyed for the
// dispatch trees (see dispatch.go).
type rendered struct {
	chains []*Chain

	natServices    []entry // nat KP-SERVICES: service addresses → chains
	natNodePorts   []entry // nat KP-NODEPORTS
	filterServices []entry // filter KP-SERVICES: no endpoints, wrong ports
	filterExternal []entry // filter KP-EXTERNAL-SERVICES: external addresses and NodePorts without endpoints
	firewall       []entry // filter KP-PROXY-FIREWALL: LoadBalancer IPs with source ranges
	healthChecks   []Rule  // filter KP-NODEPORTS: healthCheckNodePort accepted
}

// serviceRender renders one service port in one family.
type serviceRender struct {
	b     *Backend
	fam   proxy.Family
	sp    *proxy.ServicePort
	name  string // "ns/name:port", every rule's comment
	proto string // tcp, udp, sctp
	out   *rendered
}

func protoName(sp *proxy.ServicePort) string { return strings.ToLower(string(sp.Protocol)) }

// render follows upstream kube-proxy's iptables mode (syncProxyRules) for
// one service port: ClusterIPs jump to the internal policy's chain,
// external addresses and the NodePort to KP-EXT-; without endpoints for a
// policy the filter table rejects (none anywhere) or drops (none for that
// policy). The endpoint lists come from the core's SelectEndpoints.
func (b *Backend) render(fam proxy.Family, sp *proxy.ServicePort, eps []proxy.Endpoint, node proxy.Node) *rendered {
	out := &rendered{}
	clusterIPs := proxy.FilterAddrs(fam, sp.ClusterIPs)
	if len(clusterIPs) == 0 {
		return out // a single-stack service of the other family
	}
	r := &serviceRender{b: b, fam: fam, sp: sp, name: sp.Name.String(), proto: protoName(sp), out: out}
	sel := proxy.SelectEndpoints(sp, proxy.FilterEndpoints(fam, eps), node)

	var clusterChain, localChain string
	if len(sel.Cluster) > 0 && sp.UsesClusterEndpoints() {
		clusterChain = svcChainName(sp)
	}
	if len(sel.Local) > 0 && sp.UsesLocalEndpoints() {
		localChain = svlChainName(sp)
	}
	internal := clusterChain
	if sp.InternalPolicyLocal {
		internal = localChain
	}
	external := clusterChain
	if sp.ExternalPolicyLocal {
		external = localChain
	}
	usesExt := sel.Usable && sp.HasExternal()
	lbIPs := proxy.FilterAddrs(fam, sp.LoadBalancerIPs)
	ranges := proxy.FilterPrefixes(fam, sp.LoadBalancerSourceRanges)
	usesFW := sel.Usable && len(lbIPs) > 0 && len(ranges) > 0

	filterTarget, filterComment := "REJECT", r.name+" has no endpoints"
	if sel.Usable {
		filterTarget, filterComment = "DROP", r.name+" has no local endpoints"
	}

	for _, a := range clusterIPs {
		if internal != "" {
			r.nat(a, r.name+" cluster IP", r.dst(a)+" -j "+internal)
		} else {
			r.filterSvc(a, 0, filterComment, r.dst(a)+" -j "+filterTarget)
		}
		// Other ports of the ClusterIP are refused, as kp's nftables
		// mode does (after the ports' own rules in the same leaf).
		r.filterSvc(a, 1, r.name+" cluster IP: other ports", "-d "+a.String()+" -j REJECT")
	}
	extTarget := extChainName(sp)
	for _, a := range proxy.FilterAddrs(fam, sp.ExternalIPs) {
		if sel.Usable {
			r.nat(a, r.name+" external IP", r.dst(a)+" -j "+extTarget)
		}
		if external == "" {
			out.filterExternal = append(out.filterExternal, r.addrEntry(a, 0, filterComment, r.dst(a)+" -j "+filterTarget))
		}
	}
	for _, a := range lbIPs {
		if sel.Usable {
			target := extTarget
			if usesFW {
				target = fwChainName(sp)
			}
			r.nat(a, r.name+" loadbalancer IP", r.dst(a)+" -j "+target)
		}
		if usesFW {
			out.firewall = append(out.firewall, r.addrEntry(a, 0,
				fmt.Sprintf("%s traffic not accepted by %s", r.name, fwChainName(sp)), r.dst(a)+" -j DROP"))
		}
		if external == "" {
			out.filterExternal = append(out.filterExternal, r.addrEntry(a, 0, filterComment, r.dst(a)+" -j "+filterTarget))
		}
	}
	if sp.NodePort != 0 {
		if sel.Usable {
			out.natNodePorts = append(out.natNodePorts, r.portEntry(sp.NodePort, r.name,
				r.match()+fmt.Sprintf(" --dport %d -j %s", sp.NodePort, extTarget)))
		}
		if external == "" {
			out.filterExternal = append(out.filterExternal, r.portEntry(sp.NodePort, filterComment,
				"-m addrtype --dst-type LOCAL "+r.match()+fmt.Sprintf(" --dport %d -j %s", sp.NodePort, filterTarget)))
		}
	}
	if sp.HealthCheckNodePort != 0 {
		out.healthChecks = append(out.healthChecks, Rule{Comment: r.name + " health check node port",
			Args: fmt.Sprintf("-m tcp -p tcp --dport %d -j ACCEPT", sp.HealthCheckNodePort), Owner: sp.Name})
	}

	if clusterChain != "" {
		var first []Rule
		if !sp.InternalPolicyLocal {
			first = r.clusterMasquerade(clusterIPs)
		}
		r.policyChain(clusterChain, sel.Cluster, first)
	}
	if localChain != "" {
		var first []Rule
		if sp.InternalPolicyLocal {
			first = r.clusterMasquerade(clusterIPs)
		}
		r.policyChain(localChain, sel.Local, first)
	}
	if usesExt {
		r.externalChain(clusterChain, localChain, external)
	}
	if usesFW {
		r.firewallChain(lbIPs, ranges, node)
	}
	// One KP-SEP chain per endpoint either policy uses.
	seen := map[string]bool{}
	for _, e := range append(append([]proxy.Endpoint{}, sel.Cluster...), sel.Local...) {
		if name := sepChainName(sp, e); !seen[name] && (clusterChain != "" || localChain != "") {
			seen[name] = true
			r.endpointChain(name, e)
		}
	}
	return out
}

// match is the protocol match of the service port's rules.
func (r *serviceRender) match() string { return fmt.Sprintf("-m %s -p %s", r.proto, r.proto) }

// dst matches traffic to one service address and the port.
func (r *serviceRender) dst(a netip.Addr) string {
	return fmt.Sprintf("%s -d %s --dport %d", r.match(), a, r.sp.Port)
}

func (r *serviceRender) rule(comment, args string) Rule {
	return Rule{Comment: comment, Args: args, Owner: r.sp.Name}
}

func (r *serviceRender) addrEntry(a netip.Addr, order int, comment, args string) entry {
	return entry{key: addrKey(a), order: order, rule: r.rule(comment, args)}
}

func (r *serviceRender) portEntry(port int32, comment, args string) entry {
	return entry{key: uint32(port), proto: r.proto, rule: r.rule(comment, args)}
}

func (r *serviceRender) nat(a netip.Addr, comment, args string) {
	r.out.natServices = append(r.out.natServices, r.addrEntry(a, 0, comment, args))
}

func (r *serviceRender) filterSvc(a netip.Addr, order int, comment, args string) {
	r.out.filterServices = append(r.out.filterServices, r.addrEntry(a, order, comment, args))
}

// clusterMasquerade marks ClusterIP traffic for masquerade: all of it with
// --masquerade-all, else what comes from outside --cluster-cidr (so the
// replies come back through this node), as upstream.
func (r *serviceRender) clusterMasquerade(clusterIPs []netip.Addr) []Rule {
	cidrs := proxy.FilterPrefixes(r.fam, r.b.cfg.ClusterCIDRs)
	var rules []Rule
	for _, a := range clusterIPs {
		switch {
		case r.b.cfg.MasqueradeAll:
			rules = append(rules, r.rule(r.name+" cluster IP", r.dst(a)+" -j "+chainMarkMasq))
		case len(cidrs) > 0:
			rules = append(rules, r.rule(r.name+" cluster IP", fmt.Sprintf("%s ! -s %s -j %s", r.dst(a), cidrs[0], chainMarkMasq)))
		}
	}
	return rules
}

// policyChain writes a KP-SVC- or KP-SVL- chain over eps: with ClientIP
// affinity, first the client's recent endpoint while its entry lives (the
// -m recent list each KP-SEP- chain sets); then each endpoint in turn with
// probability 1/(n-i), which is uniform, the last taking what is left.
func (r *serviceRender) policyChain(name string, eps []proxy.Endpoint, first []Rule) {
	c := &Chain{Table: TableNAT, Name: name, Rules: first}
	if t := r.sp.AffinityTimeout; t > 0 {
		secs := int(t.Seconds())
		for _, e := range eps {
			sep := sepChainName(r.sp, e)
			c.Rules = append(c.Rules, r.rule(r.name+" -> "+e.String(),
				fmt.Sprintf("-m recent --name %s --rcheck --seconds %d --reap -j %s", sep, secs, sep)))
		}
	}
	for i, e := range eps {
		args := "-j " + sepChainName(r.sp, e)
		if left := len(eps) - i; left > 1 {
			args = fmt.Sprintf("-m statistic --mode random --probability %0.10f %s", 1/float64(left), args)
		}
		c.Rules = append(c.Rules, r.rule(r.name+" -> "+e.String(), args))
	}
	r.out.chains = append(r.out.chains, c)
}

// endpointChain writes a KP-SEP- chain: hairpin traffic (a pod reaching
// itself) masqueraded, the affinity list set, DNAT. NAT chains see only a
// connection's first packet, so the DNAT rule's counters count new
// connections (EndpointCounters).
func (r *serviceRender) endpointChain(name string, e proxy.Endpoint) {
	dnat := ""
	if r.sp.AffinityTimeout > 0 {
		dnat = "-m recent --name " + name + " --set "
	}
	dnat += r.match() + " -j DNAT --to-destination " + e.String()
	r.out.chains = append(r.out.chains, &Chain{Table: TableNAT, Name: name, Rules: []Rule{
		r.rule(r.name, "-s "+e.IP.String()+" -j "+chainMarkMasq),
		r.rule(r.name, dnat),
	}})
}

// externalChain writes KP-EXT-: with externalTrafficPolicy Cluster,
// masquerade and go to KP-SVC-; with Local, as upstream, pods and the node
// itself still reach every endpoint (KP-SVC-), and the rest keeps its
// source address and goes to this node's endpoints (KP-SVL-) or, with none,
// falls through to filter's DROP.
func (r *serviceRender) externalChain(clusterChain, localChain, external string) {
	c := &Chain{Table: TableNAT, Name: extChainName(r.sp)}
	if !r.sp.ExternalPolicyLocal {
		c.Rules = append(c.Rules, r.rule("masquerade traffic for "+r.name+" external destinations", "-j "+chainMarkMasq))
	} else if clusterChain != "" {
		if cidrs := proxy.FilterPrefixes(r.fam, r.b.cfg.ClusterCIDRs); len(cidrs) > 0 {
			c.Rules = append(c.Rules, r.rule("pod traffic for "+r.name+" external destinations", "-s "+cidrs[0].String()+" -j "+clusterChain))
		}
		c.Rules = append(c.Rules,
			r.rule("masquerade LOCAL traffic for "+r.name+" external destinations", "-m addrtype --src-type LOCAL -j "+chainMarkMasq),
			r.rule("route LOCAL traffic for "+r.name+" external destinations", "-m addrtype --src-type LOCAL -j "+clusterChain))
	}
	if external != "" {
		c.Rules = append(c.Rules, r.rule(r.name, "-j "+external))
	}
	r.out.chains = append(r.out.chains, c)
}

// firewallChain writes KP-FW-: the allowed source ranges go on to KP-EXT-;
// what falls through is not DNATed, and filter's KP-PROXY-FIREWALL drops it.
func (r *serviceRender) firewallChain(lbIPs []netip.Addr, ranges []netip.Prefix, node proxy.Node) {
	c := &Chain{Table: TableNAT, Name: fwChainName(r.sp)}
	ext := extChainName(r.sp)
	fromNode := false
	for _, p := range ranges {
		c.Rules = append(c.Rules, r.rule(r.name+" loadbalancer IP", "-s "+p.String()+" -j "+ext))
		for _, ip := range proxy.FilterAddrs(r.fam, node.IPs) {
			fromNode = fromNode || p.Contains(ip)
		}
	}
	// A VIP-like load balancer's address is often local: the node's own
	// requests then come from the VIP itself.
	if fromNode {
		for _, a := range lbIPs {
			c.Rules = append(c.Rules, r.rule(r.name+" loadbalancer IP", "-s "+a.String()+" -j "+ext))
		}
	}
	c.Rules = append(c.Rules, r.rule("other traffic to "+r.name+" will be dropped by "+chainProxyFirewall, ""))
	r.out.chains = append(r.out.chains, c)
}

// addrKey is the low 32 bits of a, which the dispatch trees split on.
func addrKey(a netip.Addr) uint32 {
	b := a.As16()
	return uint32(b[12])<<24 | uint32(b[13])<<16 | uint32(b[14])<<8 | uint32(b[15])
}
