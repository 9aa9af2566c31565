package userspace

import (
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpproxy/kp/explain"
	"github.com/kpproxy/kp/proxy"
)

// The world: node-a (10.0.0.5), pods in 10.244.0.0/16, Services in
// 10.96.0.0/16; web (10.96.0.10:80, NodePort 30080) has two endpoints and
// its listeners on 39017 (ClusterIP) and 39018 (external); empty
// (10.96.0.20:80) none.
func userspaceModel(listing []proxy.RuleListing) *explain.Model {
	name := func(n string) proxy.ServicePortName {
		return proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "default", Name: n}, Port: "http", Protocol: v1.ProtocolTCP}
	}
	web := &proxy.ServicePort{Name: name("web"), Type: v1.ServiceTypeNodePort, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Port: 80, NodePort: 30080, Protocol: v1.ProtocolTCP}
	empty := &proxy.ServicePort{Name: name("empty"), Type: v1.ServiceTypeClusterIP, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.20")},
		Port: 80, Protocol: v1.ProtocolTCP}
	ep := func(ip, n string) proxy.Endpoint {
		return proxy.Endpoint{IP: netip.MustParseAddr(ip), Port: 8080, Ready: true, Serving: true}.At(n, "")
	}
	st := &proxy.State{Node: proxy.Node{Name: "node-a", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.5")}},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")},
		Services:     map[proxy.ServicePortName]*proxy.ServicePort{web.Name: web, empty.Name: empty},
		Endpoints:    map[proxy.ServicePortName][]proxy.Endpoint{web.Name: {ep("10.244.1.10", "node-a"), ep("10.244.2.10", "node-b")}}}
	listing = append(listing, proxy.RuleListing{Where: "userspace listeners", Format: ListingFormatListeners,
		Text: "default/web:http TCP [::]:39017\ndefault/web:http external TCP [::]:39018\n"})
	return &explain.Model{State: st, Mode: "userspace", Rules: listing, Facts: explain.Facts{LocalCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		NodePortIPs: []netip.Addr{netip.MustParseAddr("10.0.0.5")}, LocalAddrs: []netip.Addr{netip.MustParseAddr("10.0.0.5")}}}
}

func userspacePath(t *testing.T, m *explain.Model, from, dst string) string {
	t.Helper()
	p, err := explain.ParsePacket(dst, from)
	if err != nil {
		t.Fatal(err)
	}
	x := explain.Explain(m, p, explain.Options{RulePaths: map[string]explain.RulePather{"userspace": RulePather{}}})
	var out []string
	for _, s := range x.RulePath.Steps {
		line := s.Where + ": " + s.Verdict
		if s.Element != "" {
			line += " [" + s.Element + "]"
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n")
}

func TestUserspaceRulePathEndsAtTheListener(t *testing.T) {
	const both = "one of: to 10.244.1.10:8080 | to 10.244.2.10:8080"
	iptListing := []proxy.RuleListing{{Where: "iptables-nft IPv4 nat", Format: "iptables-save", Text: "*nat\nCOMMIT\n"}}
	for _, c := range []struct {
		name, from, dst string
		listing         []proxy.RuleListing
		want            []string
	}{
		{"nftables: a ClusterIP is redirected to its listener", "10.244.3.3", "10.96.0.10:80", nil, []string{
			"ip kp-userspace prerouting: redirect to :39017 [10.96.0.10 . tcp . 80 : 39017]",
			"userspace listener TCP *:39017: " + both}},
		{"nftables: a NodePort to the external listener", "192.168.1.9", "10.0.0.5:30080", nil, []string{
			"ip kp-userspace prerouting: redirect to :39018 [tcp . 30080 : 39018]",
			"userspace listener TCP *:39018: " + both}},
		{"nftables: no endpoints is rejected on forward", "10.244.3.3", "10.96.0.20:80", nil, []string{
			"ip kp-userspace filter-forward: reject [10.96.0.20 . tcp . 80]"}},
		{"nftables: another port of the ClusterIP is rejected", "10.244.3.3", "10.96.0.10:81", nil, []string{
			"ip kp-userspace filter-forward: reject [10.96.0.10]"}},
		{"nftables: an unallocated ClusterIP is dropped", "10.244.3.3", "10.96.0.99:80", nil, []string{
			"ip kp-userspace filter-forward: drop"}},
		{"nftables: straight to a listener port is refused", "192.168.1.9", "10.0.0.5:39017", nil, []string{
			"ip kp-userspace filter-input: reject [tcp . 39017]"}},
		{"iptables: a ClusterIP is redirected to its listener", "10.244.3.3", "10.96.0.10:80", iptListing, []string{
			"nat PREROUTING: jump KP-USERSPACE-PORTALS",
			"nat KP-USERSPACE-PORTALS: redirect to :39017",
			"filter INPUT: jump KP-USERSPACE-SERVICES",
			"userspace listener TCP *:39017: " + both}},
		{"iptables: no endpoints is rejected on forward", "10.244.3.3", "10.96.0.20:80", iptListing, []string{
			"nat PREROUTING: jump KP-USERSPACE-PORTALS",
			"filter FORWARD: jump KP-USERSPACE-SERVICES",
			"filter KP-USERSPACE-SERVICES: reject"}},
		{"iptables: an unallocated ClusterIP is dropped", "10.244.3.3", "10.96.0.99:80", iptListing, []string{
			"nat PREROUTING: jump KP-USERSPACE-PORTALS",
			"filter FORWARD: jump KP-USERSPACE-SERVICES",
			"filter FORWARD: jump KP-USERSPACE-UNALLOCATED",
			"filter KP-USERSPACE-UNALLOCATED: drop"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := userspacePath(t, userspaceModel(c.listing), c.from, c.dst)
			if want := strings.Join(c.want, "\n"); got != want {
				t.Errorf("path:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}
