package nft

import (
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpproxy/kp/explain"
	"github.com/kpproxy/kp/proxy"
)

// The world of these tests: node-a (10.0.0.5, bridge 10.244.1.1), pods in
// 10.244.0.0/16, Services in 10.96.0.0/16, NodePorts on 10.0.0.5.
var explainFacts = explain.Facts{LocalCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
	NodePortIPs: addrs("10.0.0.5"), LocalAddrs: addrs("10.0.0.5", "10.244.1.1")}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

type explainSvc struct {
	sp  *proxy.ServicePort
	eps []proxy.Endpoint
}

func explainPort(name, clusterIP string, proto v1.Protocol, p int32, mods ...func(*proxy.ServicePort)) *proxy.ServicePort {
	sp := &proxy.ServicePort{Name: proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "default", Name: name},
		Protocol: proto}, Type: v1.ServiceTypeClusterIP, ClusterIPs: addrs(clusterIP), Port: p, Protocol: proto}
	for _, m := range mods {
		m(sp)
	}
	return sp
}

func readyAt(ip, node string) proxy.Endpoint {
	return proxy.Endpoint{IP: netip.MustParseAddr(ip), Port: 8080, Ready: true, Serving: true}.At(node, "")
}

func explainModel(f explain.Facts, svcs ...explainSvc) *explain.Model {
	st := &proxy.State{Services: map[proxy.ServicePortName]*proxy.ServicePort{}, Endpoints: map[proxy.ServicePortName][]proxy.Endpoint{},
		Node: proxy.Node{Name: "node-a", IPs: addrs("10.0.0.5")}, ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}}
	for _, s := range svcs {
		st.Services[s.sp.Name] = s.sp
		st.Endpoints[s.sp.Name] = s.eps
	}
	return &explain.Model{State: st, Facts: f, Mode: "nftables"}
}

func explainNodePort(np int32) func(*proxy.ServicePort) {
	return func(sp *proxy.ServicePort) { sp.Type, sp.NodePort = v1.ServiceTypeNodePort, np }
}

// explainWorld is the Model of the path tests: one Service port per feature.
func explainWorld() *explain.Model {
	two := []proxy.Endpoint{readyAt("10.244.1.10", "node-a"), readyAt("10.244.2.10", "node-b")}
	return explainModel(explainFacts,
		explainSvc{explainPort("web", "10.96.0.10", v1.ProtocolTCP, 80, explainNodePort(30080),
			func(sp *proxy.ServicePort) { sp.ExternalIPs = addrs("192.0.2.10") }), two},
		explainSvc{explainPort("dns", "10.96.0.53", v1.ProtocolUDP, 53), []proxy.Endpoint{readyAt("10.244.1.53", "node-a")}},
		explainSvc{explainPort("empty", "10.96.0.20", v1.ProtocolTCP, 80), nil},
		explainSvc{explainPort("remote", "10.96.0.31", v1.ProtocolTCP, 80, explainNodePort(30031),
			func(sp *proxy.ServicePort) { sp.ExternalPolicyLocal = true }), []proxy.Endpoint{readyAt("10.244.2.31", "node-b")}},
		explainSvc{explainPort("fw", "10.96.0.40", v1.ProtocolTCP, 443, func(sp *proxy.ServicePort) {
			sp.Type, sp.NodePort, sp.LoadBalancerIPs = v1.ServiceTypeLoadBalancer, 30100, addrs("203.0.113.7")
			sp.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
		}), []proxy.Endpoint{readyAt("10.244.2.40", "node-b")}},
		explainSvc{explainPort("sticky", "10.96.0.70", v1.ProtocolTCP, 80, func(sp *proxy.ServicePort) { sp.AffinityTimeout = 3 * time.Hour }), two},
		explainSvc{explainPort("self", "10.96.0.80", v1.ProtocolTCP, 80), []proxy.Endpoint{readyAt("10.244.1.10", "node-a")}},
		explainSvc{explainPort("host", "10.96.0.90", v1.ProtocolTCP, 80), []proxy.Endpoint{readyAt("10.0.0.5", "node-a")}},
	)
}

// pathOf is a path as "chain: verdict" lines.
func pathOf(rp explain.RulePath) []string {
	var out []string
	for _, s := range rp.Steps {
		out = append(out, strings.TrimPrefix(s.Where, "ip kp ")+": "+s.Verdict)
	}
	return out
}

func explainPath(t *testing.T, m *explain.Model, dst, from string) (*explain.Explanation, explain.RulePath) {
	t.Helper()
	p, err := explain.ParsePacket(dst, from)
	if err != nil {
		t.Fatal(err)
	}
	e := explain.Explain(m, p, explain.Options{RulePaths: map[string]explain.RulePather{"nftables": RulePather{}}})
	return e, e.RulePath
}

// The first packet's path through the rules a sync writes, per feature
// that changes a verdict, in the kernel's order and with its verdicts
// (what TestNFTRulePathIsTheKernelsTrace compares with the kernel's
// trace).
func TestRulePathPerFeature(t *testing.T) {
	const (
		fw       = "filter-prerouting-pre-dnat: jump firewall-check"
		fwOut    = "filter-output-pre-dnat: jump firewall-check"
		services = "nat-prerouting: jump services"
		checks   = "filter-forward: jump service-endpoints-check"
		ipChecks = "filter-forward: jump cluster-ips-check"
		toMasq   = "nat-postrouting: jump masquerading"
		noMasq   = "masquerading: return"
		mark     = "mark-for-masquerade: continue"
		webPick  = "pick-svc-default/web/tcp/80: continue"
		webDNAT  = "endpoint-dnat: one of: dnat to 10.244.1.10:8080 | dnat to 10.244.2.10:8080"
		// Through the shared pick-2, the paths part at the slot chains:
		// the steps after list each alternative's (explain.BranchSteps).
		webSlotDNAT = "endpoint-dnat | ip kp endpoint-dnat: dnat to 10.244.1.10:8080 | dnat to 10.244.2.10:8080"
	)
	masq := []string{toMasq, "masquerading: continue", "masquerading: masquerade"}
	cat := func(parts ...[]string) []string {
		var out []string
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	// service-slots sets the count and slots and goes to the shared
	// chains: pick-2 picks slot-0 or slot-1, each sets its slot.
	clusterIP := []string{"services: goto shared-pick", "shared-pick: goto pick-2", "pick-2: continue", "pick-2: one of: goto slot-0 | goto slot-1",
		"slot-0 | ip kp slot-1: continue | continue", "slot-0 | ip kp slot-1: continue | continue",
		"slot-0 | ip kp slot-1: goto cluster-dnat | goto cluster-dnat"}
	// A Service of one endpoint: straight to slot-0.
	shared := []string{"services: goto shared-pick", "shared-pick: goto slot-0", "slot-0: continue", "slot-0: continue", "slot-0: goto cluster-dnat"}
	external := []string{"ext-default/web/tcp/80: jump mark-for-masquerade", mark, "ext-default/web/tcp/80: jump pick-svc-default/web/tcp/80",
		webPick, "ext-default/web/tcp/80: goto endpoint-dnat", webDNAT}
	tests := []struct {
		name, dst, from string
		want            []string
	}{
		{"ClusterIP from a pod: DNAT to one of two, no masquerade", "10.96.0.10:80", "10.244.1.99",
			cat([]string{fw, services}, clusterIP, []string{"cluster-dnat: goto endpoint-dnat", webSlotDNAT, checks, ipChecks, toMasq, noMasq})},
		{"ClusterIP from outside the cluster CIDR: marked, masqueraded", "10.96.0.10:80", "192.168.7.9",
			cat([]string{fw, services}, clusterIP, []string{"cluster-dnat: jump mark-for-masquerade", mark, "cluster-dnat: goto endpoint-dnat",
				webSlotDNAT, checks, ipChecks}, masq)},
		{"ClusterIP from the node itself: the output hooks", "10.96.0.10:80", "10.0.0.5",
			cat([]string{fwOut, "nat-output: jump services"}, clusterIP, []string{"cluster-dnat: jump mark-for-masquerade", mark,
				"cluster-dnat: goto endpoint-dnat", webSlotDNAT, "filter-output: jump service-endpoints-check", "filter-output: jump cluster-ips-check"}, masq)},
		{"NodePort: the external chain marks and picks", "10.0.0.5:30080", "192.168.7.9",
			cat([]string{fw, services, "services: goto ext-default/web/tcp/80"}, external, []string{checks, ipChecks}, masq)},
		{"externalIP", "192.0.2.10:80", "192.168.7.9",
			cat([]string{fw, services, "services: goto ext-default/web/tcp/80"}, external, []string{checks, ipChecks}, masq)},
		{"LoadBalancer IP inside its source ranges", "203.0.113.7:443", "198.51.100.9",
			cat([]string{fw, "firewall-check: goto firewall-default/fw/tcp/443", services, "services: goto ext-default/fw/tcp/443",
				"ext-default/fw/tcp/443: jump mark-for-masquerade", mark, "ext-default/fw/tcp/443: jump pick-svc-default/fw/tcp/443",
				"pick-svc-default/fw/tcp/443: continue", "ext-default/fw/tcp/443: goto endpoint-dnat", "endpoint-dnat: dnat to 10.244.2.40:8080",
				checks, ipChecks}, masq)},
		{"LoadBalancer IP outside its source ranges: dropped before DNAT", "203.0.113.7:443", "192.168.7.9",
			[]string{fw, "firewall-check: goto firewall-default/fw/tcp/443", "firewall-default/fw/tcp/443: drop"}},
		{"no endpoints: rejected in the filter hook", "10.96.0.20:80", "192.168.7.9",
			[]string{fw, services, checks, "service-endpoints-check: goto reject-chain", "reject-chain: reject"}},
		{"traffic policy Local without a local endpoint: dropped on input", "10.0.0.5:30031", "192.168.7.9",
			[]string{fw, services, "services: goto ext-default/remote/tcp/80", "filter-input: jump service-endpoints-check",
				"service-endpoints-check: drop"}},
		{"a port the ClusterIP lacks: rejected", "10.96.0.10:81", "192.168.7.9",
			[]string{fw, services, checks, ipChecks, "cluster-ips-check: goto reject-chain", "reject-chain: reject"}},
		{"a UDP port the ClusterIP lacks: rejected by the second reject rule", "10.96.0.53:54/udp", "10.244.1.99",
			[]string{fw, services, checks, ipChecks, "cluster-ips-check: goto reject-chain", "reject-chain: reject"}},
		{"an unallocated ClusterIP: dropped", "10.96.9.9:80", "192.168.7.9",
			[]string{fw, services, checks, ipChecks, "cluster-ips-check: drop"}},
		{"ClientIP affinity: one DNAT rule per endpoint, one of them taken", "10.96.0.70:80", "10.244.1.99",
			[]string{fw, services, "services: goto svc-default/sticky/tcp/80",
				"svc-default/sticky/tcp/80: one of: dnat to 10.244.1.10:8080 | dnat to 10.244.2.10:8080", checks, ipChecks, toMasq, noMasq}},
		{"hairpin: the pod reaches itself and is masqueraded", "10.96.0.80:80", "10.244.1.10",
			cat([]string{fw, services}, shared, []string{"cluster-dnat: goto endpoint-dnat", "endpoint-dnat: dnat to 10.244.1.10:8080", checks, ipChecks,
				"nat-postrouting: jump mark-for-masquerade", mark}, masq)},
		{"an endpoint on the node itself: input, not forward", "10.96.0.90:80", "192.168.7.9",
			cat([]string{fw, services}, shared, []string{"cluster-dnat: jump mark-for-masquerade", mark, "cluster-dnat: goto endpoint-dnat",
				"endpoint-dnat: dnat to 10.0.0.5:8080", "filter-input: jump service-endpoints-check"})},
		{"from the node to an endpoint on it: out, then back in through loopback", "10.96.0.90:80", "10.0.0.5",
			cat([]string{fwOut, "nat-output: jump services"}, shared, []string{"cluster-dnat: jump mark-for-masquerade", mark, "cluster-dnat: goto endpoint-dnat",
				"endpoint-dnat: dnat to 10.0.0.5:8080", "filter-output: jump service-endpoints-check", "filter-output: jump cluster-ips-check",
				// 10.0.0.5 . 10.0.0.5 is the hairpin set's element of the endpoint.
				"nat-postrouting: jump mark-for-masquerade", mark}, masq, []string{fw, "filter-input: jump service-endpoints-check"})},
		{"no Service: kp's chains pass it on", "8.8.8.8:53/udp", "10.244.1.99",
			[]string{fw, services, checks, ipChecks, toMasq, noMasq}},
	}
	m := explainWorld()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, rp := explainPath(t, m, tt.dst, tt.from)
			if got := pathOf(rp); !slices.Equal(got, tt.want) {
				t.Errorf("path (%s):\n  %s\nwant:\n  %s", e.Verdict, strings.Join(got, "\n  "), strings.Join(tt.want, "\n  "))
			}
			if rp.Absent != "" || rp.Mode != "nftables" || strings.Contains(rp.Note, "disagrees") {
				t.Errorf("mode %q, absent %q, note %q", rp.Mode, rp.Absent, rp.Note)
			}
		})
	}
}

// After the random pick the steps are each alternative's: a pick of the
// client itself meets the hairpin rule, the other does not, and the path
// says so by branch; without a listing, rules are kp's own text, without
// handles.
func TestRulePathNotesWhatItCannotKnow(t *testing.T) {
	_, rp := explainPath(t, explainWorld(), "10.96.0.10:80", "10.244.1.10")
	got := pathOf(rp)
	if !slices.Contains(got, "endpoint-dnat | ip kp endpoint-dnat: dnat to 10.244.1.10:8080 | dnat to 10.244.2.10:8080") ||
		!slices.Contains(got, "nat-postrouting | -: jump mark-for-masquerade | -") ||
		!slices.Contains(got, "masquerading | ip kp masquerading: masquerade | return") {
		t.Errorf("path %q: want the pick's alternatives, the hairpin pick's way on beside the other's", got)
	}
	if !strings.Contains(rp.Note, "no listing of table ip kp") {
		t.Errorf("note %q: want the missing listing said", rp.Note)
	}
	for _, s := range rp.Steps {
		if s.Handle != 0 || s.Rule == "" {
			t.Errorf("step %+v: want kp's rule text and no handle", s)
		}
	}
	_, rp = explainPath(t, explainWorld(), "10.96.0.10:80", "")
	if !strings.Contains(rp.Note, "no --from: the path is for a packet from 10.244.0.1 (a pod)") {
		t.Errorf("note %q: want the assumed client named", rp.Note)
	}
}

// With the snapshot's listing, a step has the listed rule's text and
// handle, the rule at the same place in its chain; a chain listed with
// other rules than kp renders is noted, and its steps keep kp's text.
func TestRulePathTakesHandlesFromTheListing(t *testing.T) {
	m := explainWorld()
	m.Rules = []proxy.RuleListing{{Where: "nftables ip kp", Format: "nft", Text: `table ip kp { # handle 7
	set cluster-ips { # handle 3
		type ipv4_addr
		elements = { 10.96.0.10 }
	}

	chain nat-prerouting { # handle 11
		type nat hook prerouting priority dstnat; policy accept;
		jump services # handle 40
	}

	chain "services" { # handle 12
		meta l4proto tcp tcp flags & (fin | syn | rst | ack) != syn fib daddr type local return # handle 41
		ip daddr . meta l4proto . th dport vmap @service-ips # handle 42
	}
}
`}}
	_, rp := explainPath(t, m, "10.96.0.10:80", "192.168.7.9")
	byWhere := map[string]explain.RuleStep{}
	for _, s := range rp.Steps {
		if _, ok := byWhere[s.Where]; !ok {
			byWhere[s.Where] = s
		}
	}
	if s := byWhere["ip kp nat-prerouting"]; s.Handle != 40 || s.Rule != "jump services" {
		t.Errorf("nat-prerouting step %+v: want the listed rule, handle 40", s)
	}
	if s := byWhere["ip kp filter-forward"]; s.Handle != 0 || s.Rule != "ct state new jump service-endpoints-check" {
		t.Errorf("filter-forward step %+v: not listed, want kp's text without handle", s)
	}
	if s := byWhere["ip kp services"]; s.Handle != 0 || !regexp.MustCompile(`chain services(, chain \S+)* differ`).MatchString(rp.Note) {
		t.Errorf("services step %+v, note %q: listed with 2 rules of 4, want kp's text and the chain noted", s, rp.Note)
	}
}

// A listing read through netlink (no nft CLI) gives the handles; the rule
// text stays kp's own.
func TestRulePathTakesOnlyHandlesFromANetlinkListing(t *testing.T) {
	m := explainWorld()
	m.Rules = []proxy.RuleListing{{Where: "nftables ip kp", Format: ListingFormatNetlink, Text: `# read through netlink
table ip kp {
	chain nat-prerouting {
		type nat hook 0 priority -100;
		jump services # handle 40
	}
}
`}}
	_, rp := explainPath(t, m, "10.96.0.10:80", "192.168.7.9")
	i := slices.IndexFunc(rp.Steps, func(s explain.RuleStep) bool { return s.Where == "ip kp nat-prerouting" })
	if i < 0 || rp.Steps[i].Handle != 40 || rp.Steps[i].Rule != "jump services" {
		t.Errorf("steps %+v: want nat-prerouting's handle 40 from the netlink listing", rp.Steps)
	}
}
