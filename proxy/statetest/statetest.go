// Package statetest builds the proxy.State values the backends' and the
// server's tests sync: service port names, endpoints, and a World that
// hands out States the way proxy.ChangeTracker does (one Generation more
// each time, the change set since the last State, its own copy of the
// maps). Only tests import it.
package statetest

import (
	"fmt"
	"math/rand/v2"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpproxy/kp/proxy"
)

// PortName is the name of port port (with protocol proto) of Service ns/name.
func PortName(ns, name, port string, proto v1.Protocol) proxy.ServicePortName {
	return proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}, Port: port, Protocol: proto}
}

// Endpoint is a ready, serving endpoint at "ip:port" ("[ip]:port" for
// IPv6), changed by muts.
func Endpoint(ipPort string, muts ...func(*proxy.Endpoint)) proxy.Endpoint {
	ap := netip.MustParseAddrPort(ipPort)
	e := proxy.Endpoint{IP: ap.Addr(), Port: int32(ap.Port()), Ready: true, Serving: true}
	for _, m := range muts {
		m(&e)
	}
	return e
}

// NotReady makes an endpoint neither ready nor serving.
func NotReady(e *proxy.Endpoint) { e.Ready, e.Serving = false, false }

// Terminating makes an endpoint terminating: not ready, still serving.
func Terminating(e *proxy.Endpoint) { e.Ready, e.Serving, e.Terminating = false, true, true }

// On places an endpoint on node, in zone.
func On(node, zone string) func(*proxy.Endpoint) {
	return func(e *proxy.Endpoint) { *e = e.At(node, zone) }
}

// World is a cluster as a backend sees it. Its State is the next State
// being built: tests change it through the methods or directly (Services,
// Endpoints, Changed, Node, NodeChanged, ServiceCIDRs); Next hands it out.
type World struct {
	proxy.State
	place        func(netip.Addr) string
	nodePortType bool
}

// Option configures a World.
type Option func(*World)

// Node is the proxy's own Node: its name and primary IPs.
func Node(name string, ips ...string) Option {
	return func(w *World) {
		w.Node.Name = name
		w.Node.IPs = nil
		for _, ip := range ips {
			w.Node.IPs = append(w.Node.IPs, netip.MustParseAddr(ip))
		}
	}
}

// PlaceEndpoints puts each endpoint SetEndpoints and AddService make on
// the node place names for its address (none when place returns ""). By
// default endpoints are on no node.
func PlaceEndpoints(place func(netip.Addr) string) Option {
	return func(w *World) { w.place = place }
}

// EndpointsOn puts every endpoint SetEndpoints and AddService make on node.
func EndpointsOn(node string) Option {
	return PlaceEndpoints(func(netip.Addr) string { return node })
}

// NodePortType makes AddService give a service port with a nodePort the
// type NodePort (by default every port AddService makes is a ClusterIP).
func NodePortType() Option {
	return func(w *World) { w.nodePortType = true }
}

// New is an empty World (no Node unless an option names one).
func New(opts ...Option) *World {
	w := &World{State: proxy.State{Services: map[proxy.ServicePortName]*proxy.ServicePort{},
		Endpoints: map[proxy.ServicePortName][]proxy.Endpoint{}, Changed: map[proxy.ServicePortName]struct{}{}}}
	for _, o := range opts {
		o(w)
	}
	return w
}

// AddService sets the service port n (replacing one of the same name) on
// clusterIP:port, with nodePort when not 0, and its endpoints "ip:port"
// (see SetEndpoints). It returns the port, to change further before Next.
func (w *World) AddService(n proxy.ServicePortName, clusterIP string, port, nodePort int32, eps ...string) *proxy.ServicePort {
	sp := &proxy.ServicePort{Name: n, Type: v1.ServiceTypeClusterIP, ClusterIPs: []netip.Addr{netip.MustParseAddr(clusterIP)},
		Port: port, Protocol: n.Protocol, NodePort: nodePort}
	if w.nodePortType && nodePort != 0 {
		sp.Type = v1.ServiceTypeNodePort
	}
	w.Services[n] = sp
	w.SetEndpoints(n, eps...)
	return sp
}

// SetEndpoints replaces n's endpoints by eps, "ip:port" each, ready and
// serving (placed as PlaceEndpoints says), and marks n changed.
func (w *World) SetEndpoints(n proxy.ServicePortName, eps ...string) {
	var list []proxy.Endpoint
	for _, s := range eps {
		e := Endpoint(s)
		if w.place != nil {
			e = e.At(w.place(e.IP), "")
		}
		list = append(list, e)
	}
	w.Endpoints[n] = list
	w.MarkChanged(n)
}

// Remove deletes the service port n and its endpoints, and marks n changed.
func (w *World) Remove(n proxy.ServicePortName) {
	delete(w.Services, n)
	delete(w.Endpoints, n)
	w.MarkChanged(n)
}

// MarkChanged names n in the next State's Changed.
func (w *World) MarkChanged(n proxy.ServicePortName) {
	if w.Changed == nil {
		w.Changed = map[proxy.ServicePortName]struct{}{}
	}
	w.Changed[n] = struct{}{}
}

// Next returns the State built so far, as the change tracker's Snapshot
// does: its Generation one more than the last, its own copy of the
// Services and Endpoints maps (the ServicePorts and endpoint lists are
// shared), the Changed set and NodeChanged since the last Next. The World
// then starts a new change set.
func (w *World) Next() *proxy.State {
	w.Generation++
	st := w.State
	st.Services = make(map[proxy.ServicePortName]*proxy.ServicePort, len(w.Services))
	for k, v := range w.Services {
		st.Services[k] = v
	}
	st.Endpoints = make(map[proxy.ServicePortName][]proxy.Endpoint, len(w.Endpoints))
	for k, v := range w.Endpoints {
		st.Endpoints[k] = v
	}
	w.Changed = map[proxy.ServicePortName]struct{}{}
	w.NodeChanged = false
	return &st
}

// RandomChanges makes up to 3 random changes among 30 service ports
// ("ns/svc-0:p" to "ns/svc-29:p"): a quarter removed, the others set again
// and passed to set (to give them a protocol, a policy…). For tests that
// keep something from State to State through Changed and compare it with
// a walk of every Service.
func (w *World) RandomChanges(r *rand.Rand, set func(*proxy.ServicePort)) {
	for range r.IntN(4) {
		i := r.IntN(30)
		name := PortName("ns", fmt.Sprintf("svc-%d", i), "p", "")
		if r.IntN(4) == 0 {
			w.Remove(name)
			continue
		}
		set(w.AddService(name, fmt.Sprintf("10.96.0.%d", i), 80, 0))
	}
}
