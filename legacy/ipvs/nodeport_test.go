package ipvs

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/kpproxy/kp/proxy"
)

// NodePort virtual servers go on the Node's IPs with "primary", on every
// local address when the Node has none of the family (as in the iptables
// and userspace modes: never on no address at all), and never on a
// Service address, loopback or link-local.
func TestNodePortAddrsPrimaryFallsBackToEveryLocalAddress(t *testing.T) {
	local := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("10.0.0.5"),
		netip.MustParseAddr("10.244.1.1"), netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fe80::1")}
	dummy := map[netip.Addr]bool{netip.MustParseAddr("10.96.0.10"): true}
	node := proxy.Node{Name: "n", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.5")}}
	for _, tc := range []struct {
		name string
		cfg  proxy.Config
		node proxy.Node
		want string
	}{
		{"every local address", proxy.Config{}, node, "[10.0.0.5 10.244.1.1]"},
		{"primary: the Node's IP", proxy.Config{NodePortPrimary: true}, node, "[10.0.0.5]"},
		{"primary, no Node IP: every local address", proxy.Config{NodePortPrimary: true}, proxy.Node{Name: "n"}, "[10.0.0.5 10.244.1.1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := New(tc.cfg, nil, WithLocalAddrs(func() ([]netip.Addr, error) { return local, nil }))
			if err != nil {
				t.Fatal(err)
			}
			if got := fmt.Sprint(b.nodePortAddrs(proxy.IPv4, tc.node, dummy)); got != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
}
