package proxy

import (
	"net/netip"
	"slices"
)

// NodePortScope is where a mode answers NodePorts by its settings
// (--nodeport-addresses, as the mode's NodePortScoper reports it): the
// local addresses inside CIDRs, and with Primary the Node's IPs; neither:
// every local address.
type NodePortScope struct {
	CIDRs   []netip.Prefix
	Primary bool
}

// NodePortAddrs lists the node's addresses a NodePort answers on, by the
// mode's settings: with Primary the Node's IPs (a family the Node has none
// of: the default route's addresses), with CIDRs the local addresses
// inside them, else every local address. Only local addresses reachable
// from off the node qualify: never loopback (nftables cannot DNAT it),
// link-local, or a Service's own address (the ipvs mode's dummy interface
// holds those).
func NodePortAddrs(st *State, scope NodePortScope, localAddrs, defaultRoute []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, f := range []Family{IPv4, IPv6} {
		local := FilterAddrs(f, localAddrs)
		cand := local
		if scope.Primary || len(scope.CIDRs) > 0 {
			cand = nil
			if scope.Primary {
				cand = FilterAddrs(f, st.Node.IPs)
				if len(cand) == 0 {
					cand = FilterAddrs(f, defaultRoute)
				}
			}
			for _, a := range local {
				if slices.ContainsFunc(scope.CIDRs, func(p netip.Prefix) bool { return p.Contains(a) }) {
					cand = append(cand, a)
				}
			}
		}
		for _, a := range cand {
			if slices.Contains(local, a) && reachableNodeAddr(a) && !serviceAddr(st, a) && !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

func reachableNodeAddr(a netip.Addr) bool {
	return a.IsValid() && !a.IsLoopback() && !a.IsLinkLocalUnicast() && !a.IsMulticast() && !a.IsUnspecified()
}

// serviceAddr reports whether a is a Service's address or inside a Service
// CIDR.
func serviceAddr(st *State, a netip.Addr) bool {
	for _, p := range st.ServiceCIDRs {
		if p.Contains(a) {
			return true
		}
	}
	for _, sp := range st.Services {
		if slices.Contains(sp.ClusterIPs, a) || slices.Contains(sp.ExternalIPs, a) || slices.Contains(sp.LoadBalancerIPs, a) {
			return true
		}
	}
	return false
}
