package userspace

import (
	"errors"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/kpproxy/kp/proxy"
)

// With externalTrafficPolicy Local, a client inside the cluster (local
// traffic, or the node) may go to every endpoint. Which clients are local
// follows --detect-local-mode: the cluster CIDR, the node's pod CIDRs, or,
// for the interface modes, the interface the node routes the client to.
func TestInClusterFollowsTheDetectLocalMode(t *testing.T) {
	routes := map[netip.Addr]string{
		netip.MustParseAddr("10.244.1.5"): "cbr0",
		netip.MustParseAddr("10.244.2.5"): "veth1234",
		netip.MustParseAddr("192.0.2.9"):  "eth0",
	}
	ops := hostOps()
	ops.routeDev = func(a netip.Addr) (string, error) {
		if dev, ok := routes[a]; ok {
			return dev, nil
		}
		return "", errors.New("no route")
	}
	cluster := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}
	for _, c := range []struct {
		name   string
		detect proxy.DetectLocal
		local  []string
		remote []string
	}{
		{"ClusterCIDR", proxy.DetectLocal{}, []string{"10.244.1.5", "10.244.2.5", "10.244.9.9"}, []string{"192.0.2.9"}},
		{"NodeCIDR", proxy.DetectLocal{Mode: proxy.LocalModeNodeCIDR, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}},
			[]string{"10.244.1.5"}, []string{"10.244.2.5", "192.0.2.9"}},
		{"BridgeInterface", proxy.DetectLocal{Mode: proxy.LocalModeBridgeInterface, BridgeInterface: "cbr0"},
			[]string{"10.244.1.5"}, []string{"10.244.2.5", "192.0.2.9", "10.244.9.9"}},
		{"InterfaceNamePrefix", proxy.DetectLocal{Mode: proxy.LocalModeInterfaceNamePrefix, InterfaceNamePrefix: "veth"},
			[]string{"10.244.2.5"}, []string{"10.244.1.5", "192.0.2.9"}},
	} {
		b, err := New(proxy.Config{ClusterCIDRs: cluster, DetectLocal: c.detect}, slog.New(slog.DiscardHandler), WithNetOps(ops))
		if err != nil {
			t.Fatal(err)
		}
		node := []netip.Addr{netip.MustParseAddr("192.168.0.2")}
		b.nodeIPs.Store(&node)
		for _, a := range append(c.local, "127.0.0.1", "192.168.0.2") {
			if !b.inCluster(netip.MustParseAddr(a)) {
				t.Errorf("%s: %s is not in the cluster", c.name, a)
			}
		}
		for _, a := range c.remote {
			if b.inCluster(netip.MustParseAddr(a)) {
				t.Errorf("%s: %s is in the cluster", c.name, a)
			}
		}
	}
}

// routeDev asks the kernel: the loopback address goes out through lo.
func TestRouteDevNamesTheInterface(t *testing.T) {
	dev, err := routeDev(netip.MustParseAddr("127.0.0.1"))
	if err != nil || dev != "lo" {
		t.Errorf("route to 127.0.0.1: %q, %v", dev, err)
	}
}
