package ipvs

import (
	"net/netip"
	"slices"

	"github.com/moby/ipvs"

	"github.com/kpproxy/kp/proxy"
)

// nodePortAddrs are the addresses that get a virtual server per NodePort,
// as upstream's ipvs mode: the local addresses --nodeport-addresses
// selects (all of them without it; the Node's primary IPs with
// "primary", or all of them when the Node has no IP of f, as the iptables
// and userspace modes do), never kp-ipvs0's (Service addresses), loopback
// or IPv6 link-local ones.
func (b *Backend) nodePortAddrs(f proxy.Family, node proxy.Node, dummy map[netip.Addr]bool) []netip.Addr {
	var cand []netip.Addr
	if b.cfg.NodePortPrimary && len(proxy.FilterAddrs(f, node.IPs)) > 0 {
		cand = proxy.FilterAddrs(f, node.IPs)
	} else {
		local, err := b.localAddrs()
		if err != nil {
			b.log.Warn("cannot list this node's addresses for NodePorts", "err", err)
		}
		for _, a := range proxy.FilterAddrs(f, local) {
			if len(b.cfg.NodePortAddresses) == 0 || slices.ContainsFunc(b.cfg.NodePortAddresses, func(p netip.Prefix) bool { return p.Contains(a) }) {
				cand = append(cand, a)
			}
		}
	}
	var out []netip.Addr
	for _, a := range cand {
		if dummy[a] || a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsUnspecified() {
			continue
		}
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

func ipvsConfig(c proxy.IPVSConfig) *ipvs.Config {
	return &ipvs.Config{TimeoutTCP: c.TCPTimeout, TimeoutTCPFin: c.TCPFinTimeout, TimeoutUDP: c.UDPTimeout}
}
