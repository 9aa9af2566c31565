package iptables

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpproxy/kp/explain"
	"github.com/kpproxy/kp/proxy"
)

// The world of these tests: node-a (10.0.0.5, bridge 10.244.1.1), pods
// in 10.244.0.0/16, Services in 10.96.0.0/16.
var (
	pathNode  = proxy.Node{Name: "node-a", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.5")}}
	pathFacts = explain.Facts{LocalCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		NodePortIPs: []netip.Addr{netip.MustParseAddr("10.0.0.5")},
		LocalAddrs:  []netip.Addr{netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("10.244.1.1")}}
)

func pathPort(name, clusterIP string, proto v1.Protocol, p int32, mods ...func(*proxy.ServicePort)) *proxy.ServicePort {
	sp := &proxy.ServicePort{Name: proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "default", Name: name},
		Protocol: proto}, Type: v1.ServiceTypeClusterIP, ClusterIPs: []netip.Addr{netip.MustParseAddr(clusterIP)}, Port: p, Protocol: proto}
	for _, m := range mods {
		m(sp)
	}
	return sp
}

func pathEP(ip, node string) proxy.Endpoint {
	return proxy.Endpoint{IP: netip.MustParseAddr(ip), Port: 8080, Ready: true, Serving: true}.At(node, "")
}

func pathModel(svcs map[*proxy.ServicePort][]proxy.Endpoint) *explain.Model {
	st := &proxy.State{Services: map[proxy.ServicePortName]*proxy.ServicePort{}, Endpoints: map[proxy.ServicePortName][]proxy.Endpoint{},
		Node: pathNode, ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}}
	for sp, eps := range svcs {
		st.Services[sp.Name] = sp
		st.Endpoints[sp.Name] = eps
	}
	return &explain.Model{State: st, Facts: pathFacts, Mode: "iptables", IPTablesBackend: "nft"}
}

// pathLines prints steps as "WHERE: VERDICT" lines.
func pathLines(steps []explain.RuleStep) string {
	var b strings.Builder
	for _, s := range steps {
		fmt.Fprintf(&b, "%s: %s\n", s.Where, s.Verdict)
	}
	return b.String()
}

func explainPath(t *testing.T, m *explain.Model, from, dst string) explain.RulePath {
	t.Helper()
	p, err := explain.ParsePacket(dst, from)
	if err != nil {
		t.Fatal(err)
	}
	return explain.Explain(m, p, explain.Options{RulePaths: map[string]explain.RulePather{"iptables": RulePather{}}}).RulePath
}

func TestRulePathPerFeature(t *testing.T) {
	nodePort := func(sp *proxy.ServicePort) { sp.Type, sp.NodePort = v1.ServiceTypeNodePort, 30080 }
	web := pathPort("web", "10.96.0.10", v1.ProtocolTCP, 80, nodePort)
	webEPs := []proxy.Endpoint{pathEP("10.244.1.10", "node-a"), pathEP("10.244.2.10", "node-b")}
	one := pathPort("one", "10.96.0.11", v1.ProtocolTCP, 80)
	empty := pathPort("empty", "10.96.0.20", v1.ProtocolTCP, 80)
	local := pathPort("local", "10.96.0.30", v1.ProtocolTCP, 80, func(sp *proxy.ServicePort) {
		sp.Type, sp.NodePort, sp.ExternalPolicyLocal, sp.ExternalIPs = v1.ServiceTypeNodePort, 30090, true,
			[]netip.Addr{netip.MustParseAddr("10.96.1.30")}
	})
	fw := pathPort("fw", "10.96.0.40", v1.ProtocolTCP, 80, func(sp *proxy.ServicePort) {
		sp.Type, sp.NodePort, sp.LoadBalancerIPs = v1.ServiceTypeLoadBalancer, 30100, []netip.Addr{netip.MustParseAddr("10.96.1.40")}
		sp.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16")}
	})
	sticky := pathPort("sticky", "10.96.0.50", v1.ProtocolTCP, 80, func(sp *proxy.ServicePort) { sp.AffinityTimeout = 3 * time.Hour })
	m := pathModel(map[*proxy.ServicePort][]proxy.Endpoint{web: webEPs, one: webEPs[:1], empty: nil,
		local: {pathEP("10.244.2.30", "node-b")}, fw: webEPs[:1], sticky: webEPs[:1]})
	svc, sep0, sep1 := svcChainName(web), sepChainName(web, webEPs[0]), sepChainName(web, webEPs[1])
	oneSVC, oneSEP := svcChainName(one), sepChainName(one, webEPs[0])
	masq := `
filter FORWARD: jump KP-PROXY-FIREWALL
filter FORWARD: jump KP-FORWARD
filter KP-FORWARD: accept
nat POSTROUTING: jump KP-POSTROUTING
nat KP-POSTROUTING: continue
nat KP-POSTROUTING: masquerade`
	cases := []struct{ name, from, dst, want string }{
		{"ClusterIP from a pod: one of two endpoints, the hairpin pick masqueraded", "10.244.1.10", "10.96.0.10:80", `
nat PREROUTING: jump KP-SERVICES
nat KP-SERVICES: jump ` + svc + `
nat ` + svc + `: one of: jump ` + sep0 + ` | jump ` + sep1 + `
nat ` + sep0 + ` | -: jump KP-MARK-MASQ | -
nat KP-MARK-MASQ | -: continue | -
nat ` + sep0 + ` | nat ` + sep1 + `: dnat to 10.244.1.10:8080 | dnat to 10.244.2.10:8080
filter FORWARD: jump KP-PROXY-FIREWALL
filter FORWARD: jump KP-FORWARD
- | filter FORWARD: - | jump KP-SERVICES
filter KP-FORWARD | filter FORWARD: accept | jump KP-EXTERNAL-SERVICES
nat POSTROUTING: jump KP-POSTROUTING
nat KP-POSTROUTING | -: continue | -
nat KP-POSTROUTING | nat KP-POSTROUTING: masquerade | return`},
		{"ClusterIP from off the node: masqueraded", "192.168.1.1", "10.96.0.11:80", `
nat PREROUTING: jump KP-SERVICES
nat KP-SERVICES: jump ` + oneSVC + `
nat ` + oneSVC + `: jump KP-MARK-MASQ
nat KP-MARK-MASQ: continue
nat ` + oneSVC + `: jump ` + oneSEP + `
nat ` + oneSEP + `: dnat to 10.244.1.10:8080` + masq},
		{"ClusterIP from the node: nat and filter OUTPUT", "10.0.0.5", "10.96.0.11:80", `
nat OUTPUT: jump KP-SERVICES
nat KP-SERVICES: jump ` + oneSVC + `
nat ` + oneSVC + `: jump KP-MARK-MASQ
nat KP-MARK-MASQ: continue
nat ` + oneSVC + `: jump ` + oneSEP + `
nat ` + oneSEP + `: dnat to 10.244.1.10:8080
filter OUTPUT: jump KP-PROXY-FIREWALL
filter OUTPUT: jump KP-SERVICES
nat POSTROUTING: jump KP-POSTROUTING
nat KP-POSTROUTING: continue
nat KP-POSTROUTING: masquerade`},
		{"NodePort: KP-NODEPORTS, KP-EXT- masquerades", "192.168.1.1", "10.0.0.5:30080", `
nat PREROUTING: jump KP-SERVICES
nat KP-SERVICES: jump KP-NODEPORTS
nat KP-NODEPORTS: jump ` + extChainName(web) + `
nat ` + extChainName(web) + `: jump KP-MARK-MASQ
nat KP-MARK-MASQ: continue
nat ` + extChainName(web) + `: jump ` + svc + `
nat ` + svc + `: one of: jump ` + sep0 + ` | jump ` + sep1 + `
nat ` + sep0 + ` | nat ` + sep1 + `: dnat to 10.244.1.10:8080 | dnat to 10.244.2.10:8080` + masq},
		{"no endpoints: filter rejects", "192.168.1.1", "10.96.0.20:80", `
nat PREROUTING: jump KP-SERVICES
filter FORWARD: jump KP-PROXY-FIREWALL
filter FORWARD: jump KP-FORWARD
filter FORWARD: jump KP-SERVICES
filter KP-SERVICES: reject`},
		{"a port the ClusterIP lacks: rejected", "192.168.1.1", "10.96.0.11:81", `
nat PREROUTING: jump KP-SERVICES
filter FORWARD: jump KP-PROXY-FIREWALL
filter FORWARD: jump KP-FORWARD
filter FORWARD: jump KP-SERVICES
filter KP-SERVICES: reject`},
		{"an unallocated ClusterIP: dropped", "192.168.1.1", "10.96.0.99:80", `
nat PREROUTING: jump KP-SERVICES
filter FORWARD: jump KP-PROXY-FIREWALL
filter FORWARD: jump KP-FORWARD
filter FORWARD: jump KP-SERVICES
filter KP-SERVICES: drop`},
		{"NodePort, Local policy without a local endpoint: dropped in filter INPUT", "192.168.1.1", "10.0.0.5:30090", `
nat PREROUTING: jump KP-SERVICES
nat KP-SERVICES: jump KP-NODEPORTS
nat KP-NODEPORTS: jump ` + extChainName(local) + `
filter INPUT: jump KP-PROXY-FIREWALL
filter INPUT: jump KP-NODEPORTS
filter INPUT: jump KP-EXTERNAL-SERVICES
filter KP-EXTERNAL-SERVICES: drop`},
		{"externalIP, Local policy, from a pod: every endpoint, not masqueraded", "10.244.1.5", "10.96.1.30:80", `
nat PREROUTING: jump KP-SERVICES
nat KP-SERVICES: jump ` + extChainName(local) + `
nat ` + extChainName(local) + `: jump ` + svcChainName(local) + `
nat ` + svcChainName(local) + `: jump ` + sepChainName(local, pathEP("10.244.2.30", "node-b")) + `
nat ` + sepChainName(local, pathEP("10.244.2.30", "node-b")) + `: dnat to 10.244.2.30:8080
filter FORWARD: jump KP-PROXY-FIREWALL
filter FORWARD: jump KP-FORWARD
filter FORWARD: jump KP-SERVICES
filter FORWARD: jump KP-EXTERNAL-SERVICES
nat POSTROUTING: jump KP-POSTROUTING
nat KP-POSTROUTING: return`},
		{"LoadBalancer, source range allows", "192.168.1.1", "10.96.1.40:80", `
nat PREROUTING: jump KP-SERVICES
nat KP-SERVICES: jump ` + fwChainName(fw) + `
nat ` + fwChainName(fw) + `: jump ` + extChainName(fw) + `
nat ` + extChainName(fw) + `: jump KP-MARK-MASQ
nat KP-MARK-MASQ: continue
nat ` + extChainName(fw) + `: jump ` + svcChainName(fw) + `
nat ` + svcChainName(fw) + `: jump ` + sepChainName(fw, webEPs[0]) + `
nat ` + sepChainName(fw, webEPs[0]) + `: dnat to 10.244.1.10:8080` + masq},
		{"LoadBalancer, source range refuses: KP-FW- falls through, KP-PROXY-FIREWALL drops", "172.16.0.1", "10.96.1.40:80", `
nat PREROUTING: jump KP-SERVICES
nat KP-SERVICES: jump ` + fwChainName(fw) + `
nat ` + fwChainName(fw) + `: continue
filter FORWARD: jump KP-PROXY-FIREWALL
filter KP-PROXY-FIREWALL: drop`},
		{"no Service: kp's jumps only", "192.168.1.1", "192.0.2.1:80", `
nat PREROUTING: jump KP-SERVICES
filter FORWARD: jump KP-PROXY-FIREWALL
filter FORWARD: jump KP-FORWARD
filter FORWARD: jump KP-SERVICES
filter FORWARD: jump KP-EXTERNAL-SERVICES
nat POSTROUTING: jump KP-POSTROUTING
nat KP-POSTROUTING: return`},
		{"no --from: a pod of this node assumed, not the hairpin", "", "10.96.0.11:80", `
nat PREROUTING: jump KP-SERVICES
nat KP-SERVICES: jump ` + oneSVC + `
nat ` + oneSVC + `: jump ` + oneSEP + `
nat ` + oneSEP + `: dnat to 10.244.1.10:8080
filter FORWARD: jump KP-PROXY-FIREWALL
filter FORWARD: jump KP-FORWARD
filter FORWARD: jump KP-SERVICES
filter FORWARD: jump KP-EXTERNAL-SERVICES
nat POSTROUTING: jump KP-POSTROUTING
nat KP-POSTROUTING: return`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rp := explainPath(t, m, tc.from, tc.dst)
			if got := pathLines(rp.Steps); strings.TrimSpace(got) != strings.TrimSpace(tc.want) {
				t.Errorf("got\n%s\nwant\n%s", got, strings.TrimSpace(tc.want))
			}
		})
	}
}

type pinnedReader struct{ ep netip.AddrPort }

func (r pinnedReader) PinnedEntries(sp proxy.ServicePortName, client netip.Addr) ([]proxy.AffinityEntry, time.Time, error) {
	return []proxy.AffinityEntry{{ServicePort: sp, Client: client, Endpoint: r.ep, Expires: time.Hour}}, time.Now(), nil
}

// A client the recent module remembers goes to its endpoint by the
// --rcheck rule, no random choice; the rule text comes from the listing
// when the Model has one.
func TestRulePathAffinityAndListing(t *testing.T) {
	sticky := pathPort("sticky", "10.96.0.50", v1.ProtocolTCP, 80, func(sp *proxy.ServicePort) { sp.AffinityTimeout = 3 * time.Hour })
	eps := []proxy.Endpoint{pathEP("10.244.1.10", "node-a"), pathEP("10.244.2.10", "node-b")}
	m := pathModel(map[*proxy.ServicePort][]proxy.Endpoint{sticky: eps})
	svc, sep1 := svcChainName(sticky), sepChainName(sticky, eps[1])
	m.Rules = []proxy.RuleListing{{Where: "iptables-nft IPv4 nat", Format: "iptables-save", Text: `*nat
:KP-SERVICES - [0:0]
[7:420] -A PREROUTING -m comment --comment "kubernetes service portals" -j KP-SERVICES
-A KP-SERVICES -d 10.96.0.50/32 -p tcp -m comment --comment "default/sticky cluster IP" -m tcp --dport 80 -j ` + svc + `
-A KP-SERVICES -d 10.0.0.5/32 -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -j KP-NODEPORTS
COMMIT
`}}
	p, err := explain.ParsePacket("10.96.0.50:80", "192.168.1.1")
	if err != nil {
		t.Fatal(err)
	}
	rp := explain.Explain(m, p, explain.Options{RulePaths: map[string]explain.RulePather{"iptables": RulePather{}},
		Affinity: pinnedReader{eps[1].AddrPort()}}).RulePath
	want := `nat PREROUTING: jump KP-SERVICES
nat KP-SERVICES: jump ` + svc + `
nat ` + svc + `: jump KP-MARK-MASQ
nat KP-MARK-MASQ: continue
nat ` + svc + `: jump ` + sep1 + `
nat ` + sep1 + `: dnat to 10.244.2.10:8080
`
	if got := pathLines(rp.Steps); !strings.HasPrefix(got, want) {
		t.Fatalf("got\n%s\nwant first\n%s", got, want)
	}
	for i, w := range []string{`-A PREROUTING -m comment --comment "kubernetes service portals" -j KP-SERVICES`,
		"-A KP-SERVICES -d 10.96.0.50/32 -p tcp -m comment --comment \"default/sticky cluster IP\" -m tcp --dport 80 -j " + svc} {
		if rp.Steps[i].Rule != w {
			t.Errorf("step %d's rule %q, want the listing's %q", i, rp.Steps[i].Rule, w)
		}
	}
	if r := rp.Steps[4].Rule; !strings.Contains(r, "--rcheck") {
		t.Errorf("the pinned client's step is %q, want the --rcheck rule", r)
	}
}

// Without the client's affinity entry (kp explain reads none), its
// --rcheck rules are part of the choice: the alternatives are the
// endpoints, whichever rule picks them.
func TestRulePathAffinityUnknownIsAChoice(t *testing.T) {
	sticky := pathPort("sticky", "10.96.0.50", v1.ProtocolTCP, 80, func(sp *proxy.ServicePort) { sp.AffinityTimeout = 3 * time.Hour })
	eps := []proxy.Endpoint{pathEP("10.244.1.10", "node-a"), pathEP("10.244.2.10", "node-b")}
	m := pathModel(map[*proxy.ServicePort][]proxy.Endpoint{sticky: eps})
	svc, sep0, sep1 := svcChainName(sticky), sepChainName(sticky, eps[0]), sepChainName(sticky, eps[1])
	rp := explainPath(t, m, "192.168.1.1", "10.96.0.50:80")
	want := `nat PREROUTING: jump KP-SERVICES
nat KP-SERVICES: jump ` + svc + `
nat ` + svc + `: jump KP-MARK-MASQ
nat KP-MARK-MASQ: continue
nat ` + svc + `: one of: jump ` + sep0 + ` | jump ` + sep1 + `
nat ` + sep0 + ` | nat ` + sep1 + `: dnat to 10.244.1.10:8080 | dnat to 10.244.2.10:8080
`
	if got := pathLines(rp.Steps); !strings.HasPrefix(got, want) {
		t.Fatalf("got\n%s\nwant first\n%s", got, want)
	}
	if r := rp.Steps[4].Rule; strings.Count(r, "--rcheck") != 2 || strings.Count(r, " | ") != 3 {
		t.Errorf("the choice's rules are %q; want both --rcheck rules and both random ones", r)
	}
}
