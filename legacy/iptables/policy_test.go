package iptables

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
	v1 "k8s.io/api/core/v1"
)

// The endpoints each policy chain holds are the core's SelectEndpoints':
// these cases check the renderer follows them and upstream's fallbacks.
func TestPolicyChainsFollowTheCoresSelection(t *testing.T) {
	name := statetest.PortName("demo", "web", "", v1.ProtocolTCP)
	ep := func(s string, ready, serving, terminating bool, node string) proxy.Endpoint {
		ap := netip.MustParseAddrPort(s)
		return proxy.Endpoint{IP: ap.Addr(), Port: int32(ap.Port()), Ready: ready, Serving: serving, Terminating: terminating}.At(node, "")
	}
	for _, c := range []struct {
		name      string
		sp        func(*proxy.ServicePort)
		eps       []proxy.Endpoint
		want, not []string
	}{
		{"terminating endpoints serve only when none is ready", func(*proxy.ServicePort) {},
			[]proxy.Endpoint{ep("10.244.2.1:80", false, true, true, "node-2"), ep("10.244.2.2:80", true, true, false, "node-2")},
			[]string{"--to-destination 10.244.2.2:80"}, []string{"--to-destination 10.244.2.1:80"}},
		{"all terminating: they serve", func(*proxy.ServicePort) {},
			[]proxy.Endpoint{ep("10.244.2.1:80", false, true, true, "node-2")},
			[]string{"--to-destination 10.244.2.1:80"}, []string{"has no endpoints"}},
		{"not serving: rejected", func(*proxy.ServicePort) {},
			[]proxy.Endpoint{ep("10.244.2.1:80", false, false, true, "node-2")},
			[]string{`"demo/web has no endpoints" -m tcp -p tcp -d 10.96.0.10 --dport 80 -j REJECT`}, []string{"--to-destination"}},
		{"ETP Local without local endpoints: external traffic dropped, pods still served",
			func(sp *proxy.ServicePort) {
				sp.NodePort, sp.ExternalPolicyLocal = 30080, true
				sp.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.51.100.9")}
			},
			[]proxy.Endpoint{ep("10.244.2.1:80", true, true, false, "node-2")},
			[]string{`"demo/web has no local endpoints" -m tcp -p tcp -d 198.51.100.9 --dport 80 -j DROP`,
				`"demo/web has no local endpoints" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 30080 -j DROP`,
				`"pod traffic for demo/web external destinations" -s 10.244.0.0/16 -j KP-SVC-`,
				`--dport 30080 -j KP-EXT-`},
			[]string{"KP-SVL-"}},
		{"ITP Local uses only this node's endpoints", func(sp *proxy.ServicePort) { sp.InternalPolicyLocal = true },
			[]proxy.Endpoint{ep("10.244.1.1:80", true, true, false, "node-1"), ep("10.244.2.1:80", true, true, false, "node-2")},
			[]string{"--to-destination 10.244.1.1:80", "cluster IP\" -m tcp -p tcp -d 10.96.0.10 --dport 80 -j KP-SVL-"},
			[]string{"--to-destination 10.244.2.1:80", ":KP-SVC-"}},
		{"topology hints narrow the Cluster policy", func(*proxy.ServicePort) {},
			[]proxy.Endpoint{
				{IP: netip.MustParseAddr("10.244.2.1"), Port: 80, Ready: true, Hints: &proxy.EndpointHints{ForZones: []string{"a"}}},
				{IP: netip.MustParseAddr("10.244.2.2"), Port: 80, Ready: true, Hints: &proxy.EndpointHints{ForZones: []string{"b"}}}},
			[]string{"--to-destination 10.244.2.1:80"}, []string{"--to-destination 10.244.2.2:80"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, fk, _ := fakeBackend(t, testConfig())
			w := newWorld()
			w.Node.Labels = map[string]string{"topology.kubernetes.io/zone": "a"}
			sp := w.AddService(name, "10.96.0.10", 80, 0)
			c.sp(sp)
			w.Endpoints[name] = c.eps
			mustSync(t, b, w.Next())
			in := string(fk.Inputs[0])
			for _, s := range c.want {
				if !strings.Contains(in, s) {
					t.Errorf("no %q in:\n%s", s, in)
				}
			}
			for _, s := range c.not {
				if strings.Contains(in, s) {
					t.Errorf("unexpected %q in:\n%s", s, in)
				}
			}
		})
	}
}
