package ipvs

import (
	"net/netip"
	"slices"
	"strconv"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
)

// rendered is what one service port needs in one family: its virtual
// servers, the addresses kp-ipvs0 must hold, and its set entries.
type rendered struct {
	servers []*VirtualServer
	addrs   []netip.Addr
	entries []setEntry
}

// renderInput is what rendering a service port depends on besides the
// port and its endpoints.
type renderInput struct {
	family    proxy.Family
	scheduler string
	node      proxy.Node
	// nodeAddrs are the addresses the NodePorts answer on (nodeport.go).
	nodeAddrs []netip.Addr
}

// render turns one service port into plain values. Endpoints come from the
// core's selection: the ClusterIP servers get the internal policy's, the
// external addresses and NodePorts the external policy's; with none, a
// server has no real server and IPVS answers new connections with ICMP
// port unreachable (upstream's ipvs mode's reject).
func render(in renderInput, sp *proxy.ServicePort, eps []proxy.Endpoint) *rendered {
	f := in.family
	out := &rendered{}
	sel := proxy.SelectEndpoints(sp, proxy.FilterEndpoints(f, eps), in.node)
	internal, external := sel.Cluster, sel.Cluster
	if sp.InternalPolicyLocal {
		internal = sel.Local
	}
	if sp.ExternalPolicyLocal {
		external = sel.Local
	}
	timeout := uint32(0)
	if sp.AffinityTimeout > 0 {
		timeout = uint32((sp.AffinityTimeout + 999_999_999) / 1_000_000_000)
	}
	entry := func(k setKind, e string) { out.entries = append(out.entries, setEntry{k, e}) }
	server := func(addr netip.Addr, port int32, eps []proxy.Endpoint) {
		vs := &VirtualServer{Key: vsKey{Proto: sp.Protocol, Addr: addr, Port: uint16(port)},
			Scheduler: in.scheduler, Timeout: timeout, Owner: sp.Name}
		for _, e := range eps {
			vs.Dests = append(vs.Dests, e.AddrPort())
		}
		slices.SortFunc(vs.Dests, netip.AddrPort.Compare)
		vs.Dests = slices.Compact(vs.Dests)
		out.servers = append(out.servers, vs)
		entry(setServers, ipPort(addr, sp.Protocol, port))
	}
	bind := func(a netip.Addr) {
		out.addrs = append(out.addrs, a)
		entry(setIPVSIPs, a.String())
	}

	for _, ip := range proxy.FilterAddrs(f, sp.ClusterIPs) {
		server(ip, sp.Port, internal)
		bind(ip)
		entry(setClusterIP, ipPort(ip, sp.Protocol, sp.Port))
	}
	for _, ip := range proxy.FilterAddrs(f, sp.ExternalIPs) {
		server(ip, sp.Port, external)
		bind(ip)
		if sp.ExternalPolicyLocal {
			entry(setExternalIPLocal, ipPort(ip, sp.Protocol, sp.Port))
		} else {
			entry(setExternalIP, ipPort(ip, sp.Protocol, sp.Port))
		}
	}
	ranges := proxy.FilterPrefixes(f, sp.LoadBalancerSourceRanges)
	for _, ip := range proxy.FilterAddrs(f, sp.LoadBalancerIPs) {
		server(ip, sp.Port, external)
		bind(ip)
		e := ipPort(ip, sp.Protocol, sp.Port)
		entry(setLoadBalancer, e)
		if sp.ExternalPolicyLocal {
			entry(setLoadBalancerLocal, e)
		}
		if len(sp.LoadBalancerSourceRanges) > 0 {
			entry(setLoadBalancerFW, e)
			for _, r := range ranges {
				entry(setLBSourceCIDR, e+","+r.String())
			}
			// Upstream lets the Service's own endpoints reach it
			// (hairpin through the load balancer's address).
			for _, ep := range external {
				entry(setLBSourceIP, e+","+ep.IP.String())
			}
		}
	}
	if sp.NodePort != 0 {
		for _, a := range in.nodeAddrs {
			server(a, sp.NodePort, external)
		}
		port := strconv.Itoa(int(sp.NodePort))
		switch sp.Protocol {
		case v1.ProtocolSCTP:
			k := setNodePortSCTP
			if sp.ExternalPolicyLocal {
				k = setNodePortLocalSCTP
			}
			for _, a := range in.nodeAddrs {
				entry(k, ipPort(a, sp.Protocol, sp.NodePort))
			}
		case v1.ProtocolUDP:
			entry(setNodePortUDP, port)
			if sp.ExternalPolicyLocal {
				entry(setNodePortLocalUDP, port)
			}
		default:
			entry(setNodePortTCP, port)
			if sp.ExternalPolicyLocal {
				entry(setNodePortLocalTCP, port)
			}
		}
	}
	if sp.ExternalPolicyLocal && sp.HealthCheckNodePort != 0 {
		entry(setHealthCheck, strconv.Itoa(int(sp.HealthCheckNodePort)))
	}
	// Hairpin: a pod reaching itself through the Service is masqueraded,
	// or its own reply would bypass IPVS. Only a pod on this node can send
	// its packets through this node's IPVS, so only local endpoints get an
	// entry, as upstream's KUBE-LOOP-BACK: a node then holds one per pod
	// it runs, not one per endpoint in the cluster (100,000 at 10,000
	// Services × 10).
	for _, e := range append(slices.Clone(internal), external...) {
		if e.NodeName() != in.node.Name {
			continue
		}
		entry(setLoopBack, e.IP.String()+","+protoLower(sp.Protocol)+":"+strconv.Itoa(int(e.Port))+","+e.IP.String())
	}
	return out
}
