package ipvs

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
// 10.96.0.0/16; web (10.96.0.10:80, NodePort 30080) has two endpoints,
// empty (10.96.0.20:80) none.
func pathModel() *explain.Model {
	name := func(n string) proxy.ServicePortName {
		return proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "default", Name: n}, Protocol: v1.ProtocolTCP}
	}
	web := &proxy.ServicePort{Name: name("web"), Type: v1.ServiceTypeNodePort, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Port: 80, NodePort: 30080, Protocol: v1.ProtocolTCP}
	empty := &proxy.ServicePort{Name: name("empty"), Type: v1.ServiceTypeClusterIP, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.20")},
		Port: 80, Protocol: v1.ProtocolTCP}
	node := proxy.Node{Name: "node-a", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.5")}}
	ep := func(ip, n string) proxy.Endpoint {
		return proxy.Endpoint{IP: netip.MustParseAddr(ip), Port: 8080, Ready: true, Serving: true}.At(n, "")
	}
	st := &proxy.State{Node: node, ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")},
		Services:  map[proxy.ServicePortName]*proxy.ServicePort{web.Name: web, empty.Name: empty},
		Endpoints: map[proxy.ServicePortName][]proxy.Endpoint{web.Name: {ep("10.244.1.10", "node-a"), ep("10.244.2.10", "node-b")}}}
	return &explain.Model{State: st, Mode: "ipvs", Facts: explain.Facts{LocalCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		NodePortIPs: []netip.Addr{netip.MustParseAddr("10.0.0.5")}, LocalAddrs: []netip.Addr{netip.MustParseAddr("10.0.0.5")}}}
}

func pathOf(t *testing.T, m *explain.Model, from, dst string) []string {
	t.Helper()
	p, err := explain.ParsePacket(dst, from)
	if err != nil {
		t.Fatal(err)
	}
	x := explain.Explain(m, p, explain.Options{RulePaths: map[string]explain.RulePather{"ipvs": RulePather{}}})
	var out []string
	for _, s := range x.RulePath.Steps {
		out = append(out, s.Where+": "+s.Verdict)
	}
	return out
}

func TestRulePathFollowsTheHooksToTheVirtualServer(t *testing.T) {
	m := pathModel()
	for _, c := range []struct {
		name, from, dst string
		want            []string
	}{
		{"ClusterIP from outside the cluster is marked, scheduled and masqueraded", "192.168.1.9", "10.96.0.10:80", []string{
			"nat PREROUTING: jump KP-IPVS-SERVICES",
			"nat KP-IPVS-SERVICES: jump KP-IPVS-MARK-MASQ",
			"nat KP-IPVS-MARK-MASQ: continue",
			"nat KP-IPVS-SERVICES: jump KP-IPVS-NODE-PORT",
			"nat KP-IPVS-SERVICES: accept",
			"filter INPUT: jump KP-IPVS-FILTER",
			"filter KP-IPVS-FILTER: return",
			"filter INPUT: jump KP-IPVS-PROXY-FIREWALL",
			"filter INPUT: jump KP-IPVS-NODE-PORT",
			"ipvs TCP 10.96.0.10:80: one of: to 10.244.1.10:8080 | to 10.244.2.10:8080",
			"filter OUTPUT: jump KP-IPVS-SERVICE-CIDRS",
			"nat POSTROUTING: jump KP-IPVS-POSTROUTING",
			"nat KP-IPVS-POSTROUTING: continue",
			"nat KP-IPVS-POSTROUTING: masquerade",
		}},
		{"ClusterIP from a pod is not masqueraded", "10.244.3.3", "10.96.0.10:80", []string{
			"nat PREROUTING: jump KP-IPVS-SERVICES",
			"nat KP-IPVS-SERVICES: jump KP-IPVS-NODE-PORT",
			"nat KP-IPVS-SERVICES: accept",
			"filter INPUT: jump KP-IPVS-FILTER",
			"filter KP-IPVS-FILTER: return",
			"filter INPUT: jump KP-IPVS-PROXY-FIREWALL",
			"filter INPUT: jump KP-IPVS-NODE-PORT",
			"ipvs TCP 10.96.0.10:80: one of: to 10.244.1.10:8080 | to 10.244.2.10:8080",
			"filter OUTPUT: jump KP-IPVS-SERVICE-CIDRS",
			"nat POSTROUTING: jump KP-IPVS-POSTROUTING",
			"nat KP-IPVS-POSTROUTING: return",
		}},
		{"NodePort", "192.168.1.9", "10.0.0.5:30080", []string{
			"nat PREROUTING: jump KP-IPVS-SERVICES",
			"nat KP-IPVS-SERVICES: jump KP-IPVS-NODE-PORT",
			"nat KP-IPVS-NODE-PORT: jump KP-IPVS-MARK-MASQ",
			"nat KP-IPVS-MARK-MASQ: continue",
			"nat KP-IPVS-SERVICES: accept",
			"filter INPUT: jump KP-IPVS-FILTER",
			"filter INPUT: jump KP-IPVS-PROXY-FIREWALL",
			"filter INPUT: jump KP-IPVS-NODE-PORT",
			"ipvs TCP 10.0.0.5:30080: one of: to 10.244.1.10:8080 | to 10.244.2.10:8080",
			"filter OUTPUT: jump KP-IPVS-SERVICE-CIDRS",
			"nat POSTROUTING: jump KP-IPVS-POSTROUTING",
			"nat KP-IPVS-POSTROUTING: continue",
			"nat KP-IPVS-POSTROUTING: masquerade",
		}},
		{"no endpoints: the virtual server has no real server", "10.244.3.3", "10.96.0.20:80", []string{
			"nat PREROUTING: jump KP-IPVS-SERVICES",
			"nat KP-IPVS-SERVICES: jump KP-IPVS-NODE-PORT",
			"nat KP-IPVS-SERVICES: accept",
			"filter INPUT: jump KP-IPVS-FILTER",
			"filter KP-IPVS-FILTER: return",
			"filter INPUT: jump KP-IPVS-PROXY-FIREWALL",
			"filter INPUT: jump KP-IPVS-NODE-PORT",
			"ipvs TCP 10.96.0.20:80: reject",
		}},
		{"a port the ClusterIP lacks is rejected by the access filter", "10.244.3.3", "10.96.0.10:81", []string{
			"nat PREROUTING: jump KP-IPVS-SERVICES",
			"nat KP-IPVS-SERVICES: jump KP-IPVS-NODE-PORT",
			"filter INPUT: jump KP-IPVS-FILTER",
			"filter KP-IPVS-FILTER: reject",
		}},
		{"an unallocated ClusterIP is dropped on forward", "10.244.3.3", "10.96.0.99:80", []string{
			"nat PREROUTING: jump KP-IPVS-SERVICES",
			"filter FORWARD: jump KP-IPVS-SERVICE-CIDRS",
			"filter KP-IPVS-SERVICE-CIDRS: drop",
		}},
		{"a pod reaching itself through the ClusterIP is masqueraded (hairpin)", "10.244.1.10", "10.96.0.10:80", []string{
			"nat PREROUTING: jump KP-IPVS-SERVICES",
			"nat KP-IPVS-SERVICES: jump KP-IPVS-NODE-PORT",
			"nat KP-IPVS-SERVICES: accept",
			"filter INPUT: jump KP-IPVS-FILTER",
			"filter KP-IPVS-FILTER: return",
			"filter INPUT: jump KP-IPVS-PROXY-FIREWALL",
			"filter INPUT: jump KP-IPVS-NODE-PORT",
			"ipvs TCP 10.96.0.10:80: one of: to 10.244.1.10:8080 | to 10.244.2.10:8080",
			"filter OUTPUT: jump KP-IPVS-SERVICE-CIDRS",
			"nat POSTROUTING: jump KP-IPVS-POSTROUTING",
			"nat KP-IPVS-POSTROUTING: masquerade",
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := pathOf(t, m, c.from, c.dst)
			if strings.Join(got, "\n") != strings.Join(c.want, "\n") {
				t.Errorf("path:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(c.want, "\n"))
			}
		})
	}
}
