package userspace

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpproxy/kp/proxy"
)

func TestRenderRules(t *testing.T) {
	web := proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "demo", Name: "web"}, Port: "http", Protocol: v1.ProtocolTCP}
	dns := proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "demo", Name: "dns"}, Protocol: v1.ProtocolUDP}
	st := &proxy.State{
		Services: map[proxy.ServicePortName]*proxy.ServicePort{
			web: {Name: web, Protocol: v1.ProtocolTCP, Port: 80, NodePort: 30080,
				ClusterIPs:               []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:96::10")},
				LoadBalancerIPs:          []netip.Addr{netip.MustParseAddr("203.0.113.7")},
				LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")},
				AffinityTimeout:          time.Hour},
			dns: {Name: dns, Protocol: v1.ProtocolUDP, Port: 53, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.12")}},
		},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:96::/112")},
	}
	states := map[proxy.ServicePortName]portState{ // dns has no endpoints
		web: {ports: listenerPorts{internal: 40001, external: 40002}, usable: true},
		dns: {ports: listenerPorts{internal: 40003}}}
	lines := func(rs []Redirect) string {
		var out []string
		for _, r := range rs {
			out = append(out, r.String())
		}
		return strings.Join(out, "\n")
	}
	for _, tc := range []struct {
		name          string
		family        proxy.Family
		nodePortAddrs []netip.Prefix
		redirects     string
		rejects       string
		drops         string
	}{
		{"IPv4: ClusterIP, LoadBalancer with source ranges, NodePort on every local address; dns rejected",
			proxy.IPv4, []netip.Prefix{{}},
			`10.96.0.10 tcp dport 80 redirect to :40001 comment "demo/web:http"
saddr [198.51.100.0/24] 203.0.113.7 tcp dport 80 redirect to :40002 comment "demo/web:http"
203.0.113.7 tcp dport 80 drop comment "demo/web:http"
fib daddr type local tcp dport 30080 redirect to :40002 comment "demo/web:http"`,
			`10.96.0.12 udp dport 53 reject comment "demo/dns"
10.96.0.10 reject comment "demo/web"
10.96.0.12 reject comment "demo/dns"`,
			"10.96.0.0/16"},
		{"IPv6: the ClusterIP only; NodePort on --nodeport-addresses",
			proxy.IPv6, []netip.Prefix{netip.MustParsePrefix("fd00:1::/64")},
			`fd00:96::10 tcp dport 80 redirect to :40001 comment "demo/web:http"
daddr fd00:1::/64 fib daddr type local tcp dport 30080 redirect to :40002 comment "demo/web:http"`,
			`fd00:96::10 reject comment "demo/web"`,
			"fd00:96::/112"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := renderRules(tc.family, st, states, tc.nodePortAddrs)
			if s := lines(got.Redirects); s != tc.redirects {
				t.Errorf("redirects:\n%s\nwant\n%s", s, tc.redirects)
			}
			if s := lines(got.Rejects); s != tc.rejects {
				t.Errorf("rejects:\n%s\nwant\n%s", s, tc.rejects)
			}
			if len(got.Drops) != 1 || got.Drops[0].String() != tc.drops {
				t.Errorf("drops %v, want %s", got.Drops, tc.drops)
			}
			// Every listener, whatever the family and whether its service
			// port has endpoints: a direct connection to any is refused.
			want := []Listener{{v1.ProtocolTCP, 40001, "demo/web:http"}, {v1.ProtocolTCP, 40002, "demo/web:http external"},
				{v1.ProtocolUDP, 40003, "demo/dns"}}
			if !slices.Equal(got.Listeners, want) {
				t.Errorf("listeners %v, want %v", got.Listeners, want)
			}
		})
	}
}

// internalTrafficPolicy Local with no endpoint on this node: the
// ClusterIP's traffic is dropped (a client's connect times out, as with
// upstream), not redirected to a listener that could only hold it; the
// NodePort still goes to the external listener.
func TestRenderDropsTheClusterIPOfAnInternalLocalServiceWithoutLocalEndpoints(t *testing.T) {
	web := proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "demo", Name: "web"}, Port: "http"}
	st := &proxy.State{Services: map[proxy.ServicePortName]*proxy.ServicePort{
		web: {Name: web, Protocol: v1.ProtocolTCP, Port: 80, NodePort: 30080, InternalPolicyLocal: true,
			ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")}},
	}}
	states := map[proxy.ServicePortName]portState{
		web: {ports: listenerPorts{internal: 40001, external: 40002}, usable: true, dropInternal: true}}
	got := renderRules(proxy.IPv4, st, states, []netip.Prefix{{}})
	var lines []string
	for _, r := range got.Redirects {
		lines = append(lines, r.String())
	}
	want := `10.96.0.10 tcp dport 80 drop comment "demo/web:http"
fib daddr type local tcp dport 30080 redirect to :40002 comment "demo/web:http"`
	if s := strings.Join(lines, "\n"); s != want {
		t.Errorf("redirects:\n%s\nwant\n%s", s, want)
	}
}

// Where NodePorts answer, per family: "primary" is the Node's IPs of the
// family, or every local address when the Node has none (no Node object,
// or none of that family), as in the iptables mode; never nowhere.
func TestNodePortAddrsPrimaryFallsBackToEveryLocalAddress(t *testing.T) {
	node := proxy.Node{Name: "n", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.5")}}
	for _, tc := range []struct {
		name   string
		cfg    proxy.Config
		node   proxy.Node
		family proxy.Family
		want   []netip.Prefix
	}{
		{"default: every local address", proxy.Config{}, node, proxy.IPv4, []netip.Prefix{{}}},
		{"primary: the Node's IP", proxy.Config{NodePortPrimary: true}, node, proxy.IPv4,
			[]netip.Prefix{netip.MustParsePrefix("10.0.0.5/32")}},
		{"primary, no IPv6 Node IP: every local address", proxy.Config{NodePortPrimary: true}, node, proxy.IPv6, []netip.Prefix{{}}},
		{"primary, no Node object: every local address", proxy.Config{NodePortPrimary: true}, proxy.Node{Name: "n"}, proxy.IPv4, []netip.Prefix{{}}},
		{"CIDRs of the family", proxy.Config{NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"),
			netip.MustParsePrefix("fd00::/64")}}, node, proxy.IPv4, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := New(tc.cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			got := b.nodePortAddrs(tc.family, tc.node)
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("got %v, want %v", got, tc.want)
				}
			}
		})
	}
}
