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
	sel := proxy.SelectEndpoints(sp, proxy.FilterEndpoints(in.family, eps), in.node)
	internal, external := sel.Cluster, sel.Cluster
	if sp.InternalPolicyLocal {
		internal = sel.Local
	}
	if sp.ExternalPolicyLocal {
		external = sel.Local
	}
	r := &portRenderer{in: in, sp: sp, timeout: affinitySeconds(sp), out: &rendered{}}
	r.clusterIPs(internal)
	r.externalIPs(external)
	r.loadBalancerIPs(external)
	r.nodePorts(external)
	if sp.ExternalPolicyLocal && sp.HealthCheckNodePort != 0 {
		r.entry(setHealthCheck, strconv.Itoa(int(sp.HealthCheckNodePort)))
	}
	r.loopBack(internal, external)
	return r.out
}

// affinitySeconds is sp's session affinity timeout as IPVS takes it:
// whole seconds, rounded up; 0 without affinity.
func affinitySeconds(sp *proxy.ServicePort) uint32 {
	if sp.AffinityTimeout > 0 {
		return uint32((sp.AffinityTimeout + 999_999_999) / 1_000_000_000)
	}
	return 0
}

// portRenderer collects one service port's rendering in one family, in
// the order render calls its methods.
type portRenderer struct {
	in      renderInput
	sp      *proxy.ServicePort
	timeout uint32
	out     *rendered
}

func (r *portRenderer) entry(k setKind, e string) {
	r.out.entries = append(r.out.entries, setEntry{k, e})
}

// server adds a virtual server on addr and port with eps as its real
// servers, and records it in KP-IPVS-SERVERS.
func (r *portRenderer) server(addr netip.Addr, port int32, eps []proxy.Endpoint) {
	sp := r.sp
	vs := &VirtualServer{Key: vsKey{Proto: sp.Protocol, Addr: addr, Port: uint16(port)},
		Scheduler: r.in.scheduler, Timeout: r.timeout, Owner: sp.Name}
	for _, e := range eps {
		vs.Dests = append(vs.Dests, e.AddrPort())
	}
	slices.SortFunc(vs.Dests, netip.AddrPort.Compare)
	vs.Dests = slices.Compact(vs.Dests)
	r.out.servers = append(r.out.servers, vs)
	r.entry(setServers, ipPort(addr, sp.Protocol, port))
}

// bind puts a on kp-ipvs0, so the node accepts its packets for IPVS.
func (r *portRenderer) bind(a netip.Addr) {
	r.out.addrs = append(r.out.addrs, a)
	r.entry(setIPVSIPs, a.String())
}

func (r *portRenderer) clusterIPs(internal []proxy.Endpoint) {
	sp := r.sp
	for _, ip := range proxy.FilterAddrs(r.in.family, sp.ClusterIPs) {
		r.server(ip, sp.Port, internal)
		r.bind(ip)
		r.entry(setClusterIP, ipPort(ip, sp.Protocol, sp.Port))
	}
}

func (r *portRenderer) externalIPs(external []proxy.Endpoint) {
	sp := r.sp
	for _, ip := range proxy.FilterAddrs(r.in.family, sp.ExternalIPs) {
		r.server(ip, sp.Port, external)
		r.bind(ip)
		if sp.ExternalPolicyLocal {
			r.entry(setExternalIPLocal, ipPort(ip, sp.Protocol, sp.Port))
		} else {
			r.entry(setExternalIP, ipPort(ip, sp.Protocol, sp.Port))
		}
	}
}

func (r *portRenderer) loadBalancerIPs(external []proxy.Endpoint) {
	sp := r.sp
	ranges := proxy.FilterPrefixes(r.in.family, sp.LoadBalancerSourceRanges)
	for _, ip := range proxy.FilterAddrs(r.in.family, sp.LoadBalancerIPs) {
		r.server(ip, sp.Port, external)
		r.bind(ip)
		e := ipPort(ip, sp.Protocol, sp.Port)
		r.entry(setLoadBalancer, e)
		if sp.ExternalPolicyLocal {
			r.entry(setLoadBalancerLocal, e)
		}
		if len(sp.LoadBalancerSourceRanges) > 0 {
			r.entry(setLoadBalancerFW, e)
			for _, rg := range ranges {
				r.entry(setLBSourceCIDR, e+","+rg.String())
			}
			// Upstream lets the Service's own endpoints reach it
			// (hairpin through the load balancer's address).
			for _, ep := range external {
				r.entry(setLBSourceIP, e+","+ep.IP.String())
			}
		}
	}
}

// nodePorts adds the NodePort's virtual servers, one per NodePort address,
// and its set entries: per port for TCP and UDP, per address for SCTP.
func (r *portRenderer) nodePorts(external []proxy.Endpoint) {
	sp := r.sp
	if sp.NodePort == 0 {
		return
	}
	for _, a := range r.in.nodeAddrs {
		r.server(a, sp.NodePort, external)
	}
	port := strconv.Itoa(int(sp.NodePort))
	switch sp.Protocol {
	case v1.ProtocolSCTP:
		k := setNodePortSCTP
		if sp.ExternalPolicyLocal {
			k = setNodePortLocalSCTP
		}
		for _, a := range r.in.nodeAddrs {
			r.entry(k, ipPort(a, sp.Protocol, sp.NodePort))
		}
	case v1.ProtocolUDP:
		r.entry(setNodePortUDP, port)
		if sp.ExternalPolicyLocal {
			r.entry(setNodePortLocalUDP, port)
		}
	default:
		r.entry(setNodePortTCP, port)
		if sp.ExternalPolicyLocal {
			r.entry(setNodePortLocalTCP, port)
		}
	}
}

// loopBack: a pod reaching itself through the Service is masqueraded, or
// its own reply would bypass IPVS. Only a pod on this node can send its
// packets through this node's IPVS, so only local endpoints get an entry,
// as upstream's KUBE-LOOP-BACK: a node then holds one per pod it runs, not
// one per endpoint in the cluster (100,000 at 10,000 Services × 10).
func (r *portRenderer) loopBack(internal, external []proxy.Endpoint) {
	sp := r.sp
	for _, e := range append(slices.Clone(internal), external...) {
		if e.NodeName() != r.in.node.Name {
			continue
		}
		r.entry(setLoopBack, e.IP.String()+","+protoLower(sp.Protocol)+":"+strconv.Itoa(int(e.Port))+","+e.IP.String())
	}
}
