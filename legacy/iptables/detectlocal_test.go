package iptables

import (
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
)

// Local traffic (upstream's --detect-local-mode) decides the masquerade of
// ClusterIP traffic (what is not local) and, with externalTrafficPolicy
// Local, which external traffic may go to every endpoint (what is local):
// upstream's matches, "-s CIDR" (ClusterCIDR, NodeCIDR), "-i X"
// (BridgeInterface), "-i X+" (InterfaceNamePrefix).
func TestLocalTrafficFollowsTheDetectLocalMode(t *testing.T) {
	for _, c := range []struct {
		name   string
		detect proxy.DetectLocal
		local  string
	}{
		{"ClusterCIDR (the default)", proxy.DetectLocal{}, "-s 10.244.0.0/16"},
		{"NodeCIDR", proxy.DetectLocal{Mode: proxy.LocalModeNodeCIDR,
			PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.7.0/24"), netip.MustParsePrefix("fd00:10:244:7::/64")}},
			"-s 10.244.7.0/24"},
		{"BridgeInterface", proxy.DetectLocal{Mode: proxy.LocalModeBridgeInterface, BridgeInterface: "cbr0"}, "-i cbr0"},
		{"InterfaceNamePrefix", proxy.DetectLocal{Mode: proxy.LocalModeInterfaceNamePrefix, InterfaceNamePrefix: "veth"}, "-i veth+"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.DetectLocal = c.detect
			b, fk, _ := fakeBackend(t, cfg)
			w := featureWorld()
			mustSync(t, b, w.Next())
			in := string(fk.Inputs[0])
			web := w.Services[statetest.PortName("demo", "web", "http", v1.ProtocolTCP)]
			lb := w.Services[statetest.PortName("demo", "lb", "https", v1.ProtocolTCP)]
			for _, want := range []string{
				`-A ` + svcChainName(web) + ` -m comment --comment "demo/web:http cluster IP" -m tcp -p tcp -d 10.96.0.10 --dport 80 ! ` + c.local + ` -j KP-MARK-MASQ`,
				`-A ` + extChainName(lb) + ` -m comment --comment "pod traffic for demo/lb:https external destinations" ` + c.local + ` -j ` + svcChainName(lb),
			} {
				if !strings.Contains(in, want) {
					t.Errorf("no line %q in:\n%s", want, in)
				}
			}
		})
	}
}
