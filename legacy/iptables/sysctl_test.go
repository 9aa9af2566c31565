package iptables

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/kpproxy/kp/proxy"
)

// route_localnet is listed (for kp sysctl and kp proxy's check) exactly
// when the backend sets it: when IPv4 NodePorts answer on 127.0.0.1.
func TestRouteLocalnetIsListedAndSetOnlyForLocalhostNodePorts(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  func(*proxy.Config)
		want bool
	}{
		{"every local address", func(*proxy.Config) {}, true},
		{"localhostNodePorts false", func(c *proxy.Config) { c.LocalhostNodePorts = false }, false},
		{"primary IPs", func(c *proxy.Config) { c.NodePortPrimary = true }, false},
		{"CIDRs with loopback", func(c *proxy.Config) {
			c.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("10.0.0.0/8")}
		}, true},
		{"CIDRs without loopback", func(c *proxy.Config) { c.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")} }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig()
			c.cfg(&cfg)
			b, _, _ := fakeBackend(t, cfg)
			set := 0
			b.routeLocalnet = func() error { set++; return nil }
			mustSync(t, b, featureWorld().Next())
			want := "[]"
			if c.want {
				want = "[{net.ipv4.conf.all.route_localnet 1 IPv4 NodePorts answer on 127.0.0.1 (localhostNodePorts)}]"
			}
			if got := fmt.Sprint(b.Sysctls()); got != want || set != len(b.Sysctls()) {
				t.Errorf("Sysctls = %s, set %d times; want %s, set as often as listed", got, set, want)
			}
		})
	}
}
