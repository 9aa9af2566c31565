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
	p := r.plan(clusterIPs, proxy.SelectEndpoints(sp, proxy.FilterEndpoints(fam, eps), node))
	r.clusterIPEntries(p)
	r.externalEntries(p)
	r.ownChains(p, node)
	return out
}

// servicePlan is where each kind of a service port's traffic goes in one
// family, decided from the endpoint selection before any rule is written.
type servicePlan struct {
	sel        proxy.EndpointSelection
	clusterIPs []netip.Addr
	lbIPs      []netip.Addr
	ranges     []netip.Prefix // LoadBalancer source ranges
	// clusterChain (KP-SVC-) and localChain (KP-SVL-) are the policy
	// chains that have endpoints, "" when not written; internal and
	// external are the ones each policy's traffic jumps to.
	clusterChain, localChain string
	internal, external       string
	usesExt                  bool // KP-EXT- is written
	usesFW                   bool // KP-FW- is written
	// filterTarget and filterComment are the filter table's answer to
	// traffic of a policy without endpoints.
	filterTarget, filterComment string
}

func (r *serviceRender) plan(clusterIPs []netip.Addr, sel proxy.EndpointSelection) servicePlan {
	sp := r.sp
	p := servicePlan{sel: sel, clusterIPs: clusterIPs,
		lbIPs: proxy.FilterAddrs(r.fam, sp.LoadBalancerIPs), ranges: proxy.FilterPrefixes(r.fam, sp.LoadBalancerSourceRanges)}
	if len(sel.Cluster) > 0 && sp.UsesClusterEndpoints() {
		p.clusterChain = svcChainName(sp)
	}
	if len(sel.Local) > 0 && sp.UsesLocalEndpoints() {
		p.localChain = svlChainName(sp)
	}
	p.internal = p.clusterChain
	if sp.InternalPolicyLocal {
		p.internal = p.localChain
	}
	p.external = p.clusterChain
	if sp.ExternalPolicyLocal {
		p.external = p.localChain
	}
	p.usesExt = sel.Usable && sp.HasExternal()
	p.usesFW = sel.Usable && len(p.lbIPs) > 0 && len(p.ranges) > 0
	p.filterTarget, p.filterComment = "REJECT", r.name+" has no endpoints"
	if sel.Usable {
		p.filterTarget, p.filterComment = "DROP", r.name+" has no local endpoints"
	}
	return p
}

// clusterIPEntries adds the ClusterIPs' rules to the shared dispatch
// chains.
func (r *serviceRender) clusterIPEntries(p servicePlan) {
	for _, a := range p.clusterIPs {
		if p.internal != "" {
			r.nat(a, r.name+" cluster IP", r.dst(a)+" -j "+p.internal)
		} else {
			r.filterSvc(a, 0, p.filterComment, r.dst(a)+" -j "+p.filterTarget)
		}
		// Other ports of the ClusterIP are refused, as kp's nftables
		// mode does (after the ports' own rules in the same leaf).
		r.filterSvc(a, 1, r.name+" cluster IP: other ports", "-d "+a.String()+" -j REJECT")
	}
}

// externalEntries adds the external IPs', LoadBalancer IPs', NodePort's
// and health check's rules to the shared dispatch chains.
func (r *serviceRender) externalEntries(p servicePlan) {
	sp, out := r.sp, r.out
	extTarget := extChainName(sp)
	for _, a := range proxy.FilterAddrs(r.fam, sp.ExternalIPs) {
		if p.sel.Usable {
			r.nat(a, r.name+" external IP", r.dst(a)+" -j "+extTarget)
		}
		if p.external == "" {
			out.filterExternal = append(out.filterExternal, r.addrEntry(a, 0, p.filterComment, r.dst(a)+" -j "+p.filterTarget))
		}
	}
	for _, a := range p.lbIPs {
		if p.sel.Usable {
			target := extTarget
			if p.usesFW {
				target = fwChainName(sp)
			}
			r.nat(a, r.name+" loadbalancer IP", r.dst(a)+" -j "+target)
		}
		if p.usesFW {
			out.firewall = append(out.firewall, r.addrEntry(a, 0,
				fmt.Sprintf("%s traffic not accepted by %s", r.name, fwChainName(sp)), r.dst(a)+" -j DROP"))
		}
		if p.external == "" {
			out.filterExternal = append(out.filterExternal, r.addrEntry(a, 0, p.filterComment, r.dst(a)+" -j "+p.filterTarget))
		}
	}
	if sp.NodePort != 0 {
		if p.sel.Usable {
			out.natNodePorts = append(out.natNodePorts, r.portEntry(sp.NodePort, r.name,
				r.match()+fmt.Sprintf(" --dport %d -j %s", sp.NodePort, extTarget)))
		}
		if p.external == "" {
			out.filterExternal = append(out.filterExternal, r.portEntry(sp.NodePort, p.filterComment,
				"-m addrtype --dst-type LOCAL "+r.match()+fmt.Sprintf(" --dport %d -j %s", sp.NodePort, p.filterTarget)))
		}
	}
	if sp.HealthCheckNodePort != 0 {
		out.healthChecks = append(out.healthChecks, Rule{Comment: r.name + " health check node port",
			Args: fmt.Sprintf("-m tcp -p tcp --dport %d -j ACCEPT", sp.HealthCheckNodePort), Owner: sp.Name})
	}
}

// ownChains writes the service port's own nat chains the plan calls for:
// KP-SVC-, KP-SVL-, KP-EXT-, KP-FW-, and one KP-SEP- per endpoint either
// policy uses.
func (r *serviceRender) ownChains(p servicePlan, node proxy.Node) {
	sp := r.sp
	if p.clusterChain != "" {
		var first []Rule
		if !sp.InternalPolicyLocal {
			first = r.clusterMasquerade(p.clusterIPs)
		}
		r.policyChain(p.clusterChain, p.sel.Cluster, first)
	}
	if p.localChain != "" {
		var first []Rule
		if sp.InternalPolicyLocal {
			first = r.clusterMasquerade(p.clusterIPs)
		}
		r.policyChain(p.localChain, p.sel.Local, first)
	}
	if p.usesExt {
		r.externalChain(p.clusterChain, p.localChain, p.external)
	}
	if p.usesFW {
		r.firewallChain(p.lbIPs, p.ranges, node)
	}
	seen := map[string]bool{}
	for _, e := range append(append([]proxy.Endpoint{}, p.sel.Cluster...), p.sel.Local...) {
		if name := sepChainName(sp, e); !seen[name] && (p.clusterChain != "" || p.localChain != "") {
			seen[name] = true
			r.endpointChain(name, e)
		}
	}
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
// --masquerade-all, else what is not local traffic (so the replies come
// back through this node), as upstream.
func (r *serviceRender) clusterMasquerade(clusterIPs []netip.Addr) []Rule {
	notLocal, ok := LocalMatch(r.b.cfg, r.fam, true)
	var rules []Rule
	for _, a := range clusterIPs {
		switch {
		case r.b.cfg.MasqueradeAll:
			rules = append(rules, r.rule(r.name+" cluster IP", r.dst(a)+" -j "+chainMarkMasq))
		case ok:
			rules = append(rules, r.rule(r.name+" cluster IP", fmt.Sprintf("%s %s -j %s", r.dst(a), notLocal, chainMarkMasq)))
		}
	}
	return rules
}

// LocalMatch is the match of local traffic (from this node's pods, as
// upstream's detect-local modes tell it; with neg, of the rest): "-s CIDR"
// with the mode's CIDR of the family (ClusterCIDR, NodeCIDR), "-i X" or
// "-i X+" (BridgeInterface, InterfaceNamePrefix). ok is false when local
// traffic cannot be told: no CIDR of the family. The ipvs mode's chains
// use it too.
func LocalMatch(cfg proxy.Config, fam proxy.Family, neg bool) (match string, ok bool) {
	not := ""
	if neg {
		not = "! "
	}
	if name, prefix, isIface := cfg.LocalInterface(); isIface {
		if prefix {
			name += "+"
		}
		return not + "-i " + name, true
	}
	cidrs := proxy.FilterPrefixes(fam, cfg.LocalCIDRs())
	if len(cidrs) == 0 {
		return "", false
	}
	return not + "-s " + cidrs[0].String(), true
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
		if local, ok := LocalMatch(r.b.cfg, r.fam, false); ok {
			c.Rules = append(c.Rules, r.rule("pod traffic for "+r.name+" external destinations", local+" -j "+clusterChain))
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
