package conntrack

import (
	"net/netip"

	"github.com/kpproxy/kp/proxy"
)

// Via says which of a Service port's addresses a flow was sent to.
type Via string

const (
	ViaClusterIP      Via = "ClusterIP"
	ViaExternalIP     Via = "ExternalIP"
	ViaLoadBalancerIP Via = "LoadBalancerIP"
	ViaNodePort       Via = "NodePort"
)

// Attribution says which Service port a flow belongs to and which endpoint
// answers it.
type Attribution struct {
	ServicePort proxy.ServicePortName
	Via         Via
	// Endpoint is the flow's reply source: after DNAT, the endpoint the
	// kernel sends the flow to. It equals the flow's original destination
	// when the flow was not DNATed (it started before the Service had a
	// rule).
	Endpoint netip.AddrPort
	// Known is set when Endpoint is one of the service port's endpoints in
	// the State the Index was built from; then Info describes it.
	Known bool
	Info  proxy.Endpoint
}

// Index finds the Service port of a flow by its original destination: a
// ClusterIP, external IP or LoadBalancer IP with protocol and port, or a
// node address with protocol and NodePort. Build one per State.
type Index struct {
	byAddr     map[frontend]target
	byNodePort map[protoPort]target
	nodeIPs    map[netip.Addr]bool
}

type frontend struct {
	addr  netip.Addr
	proto uint8
	port  uint16
}

type protoPort struct {
	proto uint8
	port  uint16
}

type target struct {
	name proxy.ServicePortName
	via  Via
	eps  []proxy.Endpoint
}

// NewIndex indexes st's service ports. NodePorts match flows addressed to
// st's node IPs or to any of nodeIPs (the namespace's local addresses: kp
// may serve NodePorts on more than the primary IPs).
func NewIndex(st *proxy.State, nodeIPs []netip.Addr) *Index {
	n := 0
	if st != nil {
		n = len(st.Services)
	}
	ix := &Index{byAddr: make(map[frontend]target, n), byNodePort: map[protoPort]target{}, nodeIPs: map[netip.Addr]bool{}}
	for _, a := range nodeIPs {
		ix.nodeIPs[a.Unmap()] = true
	}
	if st == nil {
		return ix
	}
	for _, a := range st.Node.IPs {
		ix.nodeIPs[a.Unmap()] = true
	}
	for name, sp := range st.Services {
		ix.add(sp, st.Endpoints[name])
	}
	return ix
}

func (ix *Index) add(sp *proxy.ServicePort, eps []proxy.Endpoint) {
	proto := proxy.ProtocolNumber(sp.Protocol)
	for _, g := range []struct {
		via   Via
		addrs []netip.Addr
	}{{ViaClusterIP, sp.ClusterIPs}, {ViaExternalIP, sp.ExternalIPs}, {ViaLoadBalancerIP, sp.LoadBalancerIPs}} {
		for _, a := range g.addrs {
			ix.byAddr[frontend{a.Unmap(), proto, uint16(sp.Port)}] = target{sp.Name, g.via, eps}
		}
	}
	if sp.NodePort != 0 {
		ix.byNodePort[protoPort{proto, uint16(sp.NodePort)}] = target{sp.Name, ViaNodePort, eps}
	}
}

// lookup finds the Service port f was addressed to.
func (ix *Index) lookup(f Flow) (target, bool) {
	dst := f.Orig.Dst
	if t, ok := ix.byAddr[frontend{dst.Addr(), f.Protocol, dst.Port()}]; ok {
		return t, true
	}
	if ix.nodeIPs[dst.Addr()] {
		if t, ok := ix.byNodePort[protoPort{f.Protocol, dst.Port()}]; ok {
			return t, true
		}
	}
	return target{}, false
}

// Lookup finds the Service port a packet of protocol proto (an IP
// protocol number) addressed to dst belongs to, and which of its
// addresses dst is: what kp explain starts from.
func (ix *Index) Lookup(proto uint8, dst netip.AddrPort) (proxy.ServicePortName, Via, bool) {
	t, ok := ix.lookup(Flow{Protocol: proto, Orig: Tuple{Dst: netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())}})
	return t.name, t.via, ok
}

// Attribute returns the Service port and endpoint of f, or false when f
// was not addressed to a Service.
func (ix *Index) Attribute(f Flow) (Attribution, bool) {
	t, ok := ix.lookup(f)
	if !ok {
		return Attribution{}, false
	}
	a := Attribution{ServicePort: t.name, Via: t.via, Endpoint: f.Reply.Src}
	for _, e := range t.eps {
		if e.AddrPort() == f.Reply.Src {
			a.Known, a.Info = true, e
			break
		}
	}
	return a, true
}
