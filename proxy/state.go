package proxy

import (
	"net/netip"
	"time"
)

// State is an immutable snapshot of everything a backend needs to program the
// kernel. A new State is built for every sync; backends must not modify it.
type State struct {
	// Generation increases by one with every snapshot.
	Generation uint64
	// Services holds every valid ServicePort by name.
	Services map[ServicePortName]*ServicePort
	// Endpoints holds each ServicePort's endpoints, sorted by address and
	// deduplicated (a ServicePort with none has no entry or an empty slice).
	Endpoints map[ServicePortName][]Endpoint
	// Changed names the ServicePorts whose Service or endpoints differ from
	// the previous snapshot (added, modified or removed). A backend that
	// synced the previous snapshot successfully need only look at these.
	Changed map[ServicePortName]struct{}
	// NodeChanged is set when the Node (addresses, labels) differs from the
	// previous snapshot; per-node decisions (topology, local endpoints) must
	// then be recomputed for every ServicePort.
	NodeChanged bool
	Node        Node
	// ServiceCIDRs are the ranges ClusterIPs are allocated from (both
	// families; empty when unknown): traffic to an address in them that no
	// Service has is dropped. They come from the ServiceCIDR objects and
	// kp's --service-cidrs, sorted (IPv4 first), masked and deduplicated.
	ServiceCIDRs []netip.Prefix
	// TriggerTimes holds, per changed ServicePort, the oldest
	// endpoints.kubernetes.io/last-change-trigger-time not yet synced, for
	// the network programming latency metric.
	TriggerTimes map[ServicePortName]time.Time
	// ServiceCIDRsChanged is set when ServiceCIDRs differ from the
	// previous snapshot's.
	ServiceCIDRsChanged bool
}

// Family selects one IP family.
type Family int

const (
	IPv4 Family = 4
	IPv6 Family = 6
)

func (f Family) String() string {
	if f == IPv6 {
		return "IPv6"
	}
	return "IPv4"
}

// Has reports whether a belongs to the family.
func (f Family) Has(a netip.Addr) bool {
	if f == IPv6 {
		return a.Is6() && !a.Is4In6()
	}
	return a.Is4() || a.Is4In6()
}

// FilterAddrs returns the addresses of family f, in order.
func FilterAddrs(f Family, addrs []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		if f.Has(a) {
			out = append(out, a)
		}
	}
	return out
}

// FilterEndpoints returns the endpoints of family f, in order.
func FilterEndpoints(f Family, eps []Endpoint) []Endpoint {
	n := 0
	for _, e := range eps {
		if f.Has(e.IP) {
			n++
		}
	}
	switch n {
	case 0:
		return nil
	case len(eps):
		// The usual slice, all of one family: eps itself, capped so that
		// an append copies (endpoint lists are shared, never written).
		return eps[:n:n]
	}
	out := make([]Endpoint, 0, n)
	for _, e := range eps {
		if f.Has(e.IP) {
			out = append(out, e)
		}
	}
	return out
}

// FilterPrefixes returns the prefixes of family f, in order.
func FilterPrefixes(f Family, ps []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if f.Has(p.Addr()) {
			out = append(out, p)
		}
	}
	return out
}
