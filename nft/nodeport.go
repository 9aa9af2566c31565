package nft

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/kpproxy/kp/proxy"
)

// nodePortIPs returns the addresses NodePorts answer on: with
// --nodeport-addresses CIDRs, this namespace's addresses inside them; with
// "primary" or no flag (upstream's nftables-mode default), the node's primary
// IPs, taken from the Node object, or else from the interface that holds the
// default route. Loopback never qualifies (nftables cannot DNAT it).
func (b *Backend) nodePortIPs(s *proxy.State) ([]netip.Addr, error) {
	if len(b.cfg.NodePortAddresses) > 0 {
		addrs, err := b.localAddrs()
		if err != nil {
			return nil, err
		}
		var out []netip.Addr
		for _, a := range addrs {
			for _, p := range b.cfg.NodePortAddresses {
				if p.Contains(a) && !a.IsLoopback() {
					out = append(out, a)
					break
				}
			}
		}
		if b.cfg.NodePortPrimary {
			out = append(out, s.Node.IPs...)
		}
		return out, nil
	}
	if len(s.Node.IPs) > 0 {
		return s.Node.IPs, nil
	}
	return b.defaultAddrs()
}

func handleIn(nsFd int) (*netlink.Handle, error) {
	if nsFd > 0 {
		return netlink.NewHandleAt(netns.NsHandle(nsFd))
	}
	return netlink.NewHandle()
}

func listLocalAddrsIn(nsFd int) ([]netip.Addr, error) {
	h, err := handleIn(nsFd)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	list, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

// DefaultRouteAddrs returns the global addresses of the interfaces holding
// a default route in the caller's network namespace: where this mode
// answers NodePorts on the node's primary IPs when the Node has none (kp
// migrate's verify step probes them).
func DefaultRouteAddrs() ([]netip.Addr, error) { return defaultRouteAddrsIn(0) }

// defaultRouteAddrsIn returns the global addresses of the interfaces
// holding a default route, per family.
func defaultRouteAddrsIn(nsFd int) ([]netip.Addr, error) {
	h, err := handleIn(nsFd)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	var out []netip.Addr
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := h.RouteList(nil, fam)
		if err != nil {
			return nil, fmt.Errorf("list routes: %w", err)
		}
		for _, r := range routes {
			if r.Dst != nil && !isDefault(r.Dst.String()) {
				continue
			}
			link, err := h.LinkByIndex(r.LinkIndex)
			if err != nil {
				continue
			}
			addrs, err := h.AddrList(link, fam)
			if err != nil {
				continue
			}
			for _, a := range addrs {
				ip, ok := netip.AddrFromSlice(a.IP)
				if ok && ip.IsGlobalUnicast() {
					out = append(out, ip.Unmap())
				}
			}
			break
		}
	}
	return out, nil
}

func isDefault(cidr string) bool { return cidr == "0.0.0.0/0" || cidr == "::/0" }
