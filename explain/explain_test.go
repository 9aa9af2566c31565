package explain

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpproxy/kp/proxy"
)

// The world of these tests: node-a in zone-a (10.0.0.5, bridge 10.244.1.1),
// pods in 10.244.0.0/16, Services in 10.96.0.0/16, NodePorts on 10.0.0.5.
var (
	nodeA = proxy.Node{Name: "node-a", IPs: addrs_("10.0.0.5"), Labels: map[string]string{v1.LabelTopologyZone: "zone-a"}}
	facts = Facts{LocalCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		NodePortIPs: addrs_("10.0.0.5"), LocalAddrs: addrs_("10.0.0.5", "10.244.1.1", "192.168.7.1")}
)

func addrs_(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

type svc struct {
	sp  *proxy.ServicePort
	eps []proxy.Endpoint
}

func port(name string, clusterIP string, proto v1.Protocol, p int32, mods ...func(*proxy.ServicePort)) *proxy.ServicePort {
	sp := &proxy.ServicePort{Name: proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "default", Name: name},
		Protocol: proto}, Type: v1.ServiceTypeClusterIP, ClusterIPs: addrs_(clusterIP), Port: p, Protocol: proto}
	for _, m := range mods {
		m(sp)
	}
	return sp
}

func ep(ip, node, zone string, ready, serving, terminating bool) proxy.Endpoint {
	return proxy.Endpoint{IP: netip.MustParseAddr(ip), Port: 8080, Ready: ready, Serving: serving, Terminating: terminating}.At(node, zone)
}

func ready(ip, node string) proxy.Endpoint { return ep(ip, node, "", true, true, false) }

func model(f Facts, svcs ...svc) *Model {
	st := &proxy.State{Services: map[proxy.ServicePortName]*proxy.ServicePort{}, Endpoints: map[proxy.ServicePortName][]proxy.Endpoint{},
		Node: nodeA, ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}}
	for _, s := range svcs {
		st.Services[s.sp.Name] = s.sp
		st.Endpoints[s.sp.Name] = s.eps
	}
	return &Model{State: st, Facts: f, Mode: "nftables"}
}

func nodePort(np int32) func(*proxy.ServicePort) {
	return func(sp *proxy.ServicePort) { sp.Type, sp.NodePort = v1.ServiceTypeNodePort, np }
}

func etpLocal(sp *proxy.ServicePort) { sp.ExternalPolicyLocal = true }

func lb(ip string, ranges ...string) func(*proxy.ServicePort) {
	return func(sp *proxy.ServicePort) {
		sp.Type, sp.NodePort, sp.LoadBalancerIPs = v1.ServiceTypeLoadBalancer, 30100, addrs_(ip)
		for _, r := range ranges {
			sp.LoadBalancerSourceRanges = append(sp.LoadBalancerSourceRanges, netip.MustParsePrefix(r))
		}
	}
}

// One case per row of the README's feature table that changes a verdict.
func TestExplainPerFeature(t *testing.T) {
	web := port("web", "10.96.0.10", v1.ProtocolTCP, 80, nodePort(30080))
	webEPs := []proxy.Endpoint{ready("10.244.1.10", "node-a"), ready("10.244.2.10", "node-b")}
	dns := port("dns", "10.96.0.53", v1.ProtocolUDP, 53)
	empty := port("empty", "10.96.0.20", v1.ProtocolTCP, 80)
	local := port("local", "10.96.0.30", v1.ProtocolTCP, 80, nodePort(30030), etpLocal)
	remoteOnly := port("remote", "10.96.0.31", v1.ProtocolTCP, 80, nodePort(30031), etpLocal)
	itp := port("itp", "10.96.0.32", v1.ProtocolTCP, 80, func(sp *proxy.ServicePort) { sp.InternalPolicyLocal = true })
	fw := port("fw", "10.96.0.40", v1.ProtocolTCP, 443, lb("203.0.113.7", "198.51.100.0/24"))
	rolling := port("rolling", "10.96.0.50", v1.ProtocolTCP, 80)
	zoned := port("zoned", "10.96.0.60", v1.ProtocolTCP, 80, func(sp *proxy.ServicePort) { sp.TrafficDistribution = v1.ServiceTrafficDistributionPreferClose })
	sticky := port("sticky", "10.96.0.70", v1.ProtocolTCP, 80, func(sp *proxy.ServicePort) { sp.AffinityTimeout = 3 * time.Hour })
	m := model(facts,
		svc{web, webEPs}, svc{dns, []proxy.Endpoint{ready("10.244.1.53", "node-a")}}, svc{empty, nil},
		svc{local, []proxy.Endpoint{ready("10.244.1.30", "node-a"), ready("10.244.2.30", "node-b")}},
		svc{remoteOnly, []proxy.Endpoint{ready("10.244.2.31", "node-b")}},
		svc{itp, []proxy.Endpoint{ready("10.244.2.32", "node-b")}},
		svc{fw, []proxy.Endpoint{ready("10.244.2.40", "node-b")}},
		svc{rolling, []proxy.Endpoint{ep("10.244.1.50", "node-a", "", false, true, true), ep("10.244.2.50", "node-b", "", false, false, false)}},
		svc{zoned, []proxy.Endpoint{ep("10.244.1.60", "node-a", "zone-a", true, true, false), ep("10.244.2.60", "node-b", "zone-b", true, true, false)}},
		svc{sticky, webEPs},
	)

	tests := []struct {
		name, dst, from string
		verdict         Verdict
		kind            string
		reject          string
		chosen          []string // eligible endpoints, in order
		masquerade      string
		why             string // a part of Why, or of the address detail for not-kps
	}{
		{name: "ClusterIP from a pod: DNAT to every ready endpoint, no masquerade", dst: "10.96.0.10:80", from: "10.244.1.99",
			verdict: VerdictDNAT, kind: KindClusterIP, chosen: []string{"10.244.1.10:8080", "10.244.2.10:8080"}, masquerade: "no"},
		{name: "ClusterIP from outside the cluster CIDR is masqueraded", dst: "10.96.0.10:80", from: "192.168.7.9",
			verdict: VerdictDNAT, kind: KindClusterIP, chosen: []string{"10.244.1.10:8080", "10.244.2.10:8080"}, masquerade: "yes"},
		{name: "UDP ClusterIP", dst: "10.96.0.53:53/udp", verdict: VerdictDNAT, kind: KindClusterIP, chosen: []string{"10.244.1.53:8080"}, masquerade: "no"},
		{name: "no endpoints: TCP is reset", dst: "10.96.0.20:80", verdict: VerdictReject, kind: KindClusterIP, reject: "TCP reset", why: "no endpoint"},
		{name: "a port the Service lacks is rejected", dst: "10.96.0.10:81", verdict: VerdictReject, kind: KindClusterIP, reject: "TCP reset",
			why: "a port the Service lacks"},
		{name: "a UDP port the Service lacks gets ICMP port unreachable", dst: "10.96.0.53:54/udp", verdict: VerdictReject, kind: KindClusterIP,
			reject: "ICMP port unreachable"},
		{name: "an unallocated ClusterIP is dropped", dst: "10.96.9.9:80", verdict: VerdictDrop, kind: KindServiceCIDR, why: "unallocated"},
		{name: "an address no Service has is not kp's", dst: "8.8.8.8:53/udp", verdict: VerdictNotKPs, kind: KindNone, why: "no Service has"},
		{name: "NodePort on a NodePort address: DNAT, masqueraded (externalTrafficPolicy Cluster)", dst: "10.0.0.5:30080", from: "192.168.7.9",
			verdict: VerdictDNAT, kind: KindNodePort, chosen: []string{"10.244.1.10:8080", "10.244.2.10:8080"}, masquerade: "yes"},
		{name: "NodePort on a node address NodePorts do not answer on is not kp's", dst: "192.168.7.1:30080", verdict: VerdictNotKPs,
			kind: KindNone, why: "only on 10.0.0.5"},
		{name: "externalTrafficPolicy Local from outside: this node's endpoint, source kept", dst: "10.0.0.5:30030", from: "192.168.50.1",
			verdict: VerdictDNAT, kind: KindNodePort, chosen: []string{"10.244.1.30:8080"}, masquerade: "no"},
		{name: "externalTrafficPolicy Local from a pod reaches every endpoint", dst: "10.0.0.5:30030", from: "10.244.1.99",
			verdict: VerdictDNAT, kind: KindNodePort, chosen: []string{"10.244.1.30:8080", "10.244.2.30:8080"}, masquerade: "no"},
		{name: "externalTrafficPolicy Local with none local is dropped", dst: "10.0.0.5:30031", from: "192.168.50.1",
			verdict: VerdictDrop, kind: KindNodePort, why: "no endpoint on this node"},
		{name: "internalTrafficPolicy Local with none local is dropped", dst: "10.96.0.32:80", verdict: VerdictDrop, kind: KindClusterIP},
		{name: "loadBalancerSourceRanges refuse a client outside them", dst: "203.0.113.7:443", from: "192.168.50.1",
			verdict: VerdictDrop, kind: KindLoadBalancerIP, why: "source range refused"},
		{name: "loadBalancerSourceRanges let a client inside them through", dst: "203.0.113.7:443", from: "198.51.100.20",
			verdict: VerdictDNAT, kind: KindLoadBalancerIP, chosen: []string{"10.244.2.40:8080"}, masquerade: "yes"},
		{name: "serving terminating endpoints are the fallback", dst: "10.96.0.50:80", verdict: VerdictDNAT, kind: KindClusterIP,
			chosen: []string{"10.244.1.50:8080"}, masquerade: "no"},
		{name: "trafficDistribution PreferClose keeps to the zone", dst: "10.96.0.60:80", verdict: VerdictDNAT, kind: KindClusterIP,
			chosen: []string{"10.244.1.60:8080"}, masquerade: "no"},
		{name: "session affinity: still a random pick, the pin is kernel state", dst: "10.96.0.70:80", from: "10.244.1.99",
			verdict: VerdictDNAT, kind: KindClusterIP, chosen: []string{"10.244.1.10:8080", "10.244.2.10:8080"}, masquerade: "no"},
		{name: "hairpin: a pod reaching itself may be masqueraded", dst: "10.96.0.10:80", from: "10.244.1.10",
			verdict: VerdictDNAT, kind: KindClusterIP, chosen: []string{"10.244.1.10:8080", "10.244.2.10:8080"}, masquerade: "depends"},
		{name: "an IPv6 address on an IPv4-only node is not kp's", dst: "[fd00::10]:80", verdict: VerdictNotKPs, kind: KindNone,
			why: "no IPv6 address"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ParsePacket(tc.dst, tc.from)
			if err != nil {
				t.Fatal(err)
			}
			e := Explain(m, p, Options{})
			var out strings.Builder
			if err := Write(&out, e); err != nil {
				t.Fatal(err)
			}
			t.Log("\n" + out.String())
			if e.Verdict != tc.verdict || e.Address.Kind != tc.kind || e.Reject != tc.reject {
				t.Errorf("verdict %s (%s), kind %s, reject %q; want %s, %s, %q", e.Verdict, e.Why, e.Address.Kind, e.Reject, tc.verdict, tc.kind, tc.reject)
			}
			var chosen []string
			total := 0.0
			for _, x := range e.Endpoints {
				if x.Eligible {
					chosen = append(chosen, x.Address)
					total += x.Probability
				}
			}
			if strings.Join(chosen, " ") != strings.Join(tc.chosen, " ") {
				t.Errorf("chosen %v, want %v", chosen, tc.chosen)
			}
			if len(chosen) > 0 && (total < 0.999 || total > 1.001) {
				t.Errorf("probabilities add up to %f", total)
			}
			got := ""
			if e.Masquerade != nil {
				got = e.Masquerade.Decision
			}
			if got != tc.masquerade {
				t.Errorf("masquerade %q, want %q", got, tc.masquerade)
			}
			if tc.why != "" && !strings.Contains(e.Why+" "+e.Address.Detail, tc.why) {
				t.Errorf("why %q / %q does not say %q", e.Why, e.Address.Detail, tc.why)
			}
			if e.RulePath.Absent == "" && len(e.RulePath.Steps) == 0 {
				t.Error("the rule path is neither filled nor said absent")
			}
		})
	}
}

// In the ipvs mode a policy without a local endpoint is an IPVS virtual
// server without real servers: IPVS refuses the connection, where the
// other modes drop it (the e2e trace test met a refusal where explain had
// said drop).
func TestExplainIPVSRefusesWhereThePolicyHasNoLocalEndpoint(t *testing.T) {
	remoteOnly := port("remote", "10.96.0.31", v1.ProtocolTCP, 80, nodePort(30031), etpLocal)
	m := model(facts, svc{remoteOnly, []proxy.Endpoint{ready("10.244.2.31", "node-b")}})
	for mode, want := range map[string]Verdict{"nftables": VerdictDrop, "iptables": VerdictDrop, "userspace": VerdictDrop, "ipvs": VerdictReject} {
		m.Mode = mode
		p, err := ParsePacket("10.0.0.5:30031", "192.168.50.1")
		if err != nil {
			t.Fatal(err)
		}
		if e := Explain(m, p, Options{}); e.Verdict != want || (want == VerdictReject) != (e.Reject == "ICMP port unreachable") {
			t.Errorf("%s: %s reject %q (%s), want %s", mode, e.Verdict, e.Reject, e.Why, want)
		}
	}
}

func TestExplainSaysWhyEachEndpointIsLeftOut(t *testing.T) {
	zoned := port("zoned", "10.96.0.60", v1.ProtocolTCP, 80, func(sp *proxy.ServicePort) { sp.TrafficDistribution = v1.ServiceTrafficDistributionPreferClose })
	m := model(facts, svc{zoned, []proxy.Endpoint{ep("10.244.1.60", "node-a", "zone-a", true, true, false),
		ep("10.244.2.60", "node-b", "zone-b", true, true, false), ep("10.244.2.61", "node-b", "zone-a", false, false, false)}})
	p, _ := ParsePacket("10.96.0.60:80", "")
	e := Explain(m, p, Options{})
	want := []string{string(proxy.ReasonReady), string(proxy.ReasonOtherZone), string(proxy.ReasonNotReady)}
	for i, x := range e.Endpoints {
		if x.Reason != want[i] {
			t.Errorf("%s: %s (%s), want %s", x.Address, x.Reason, x.Detail, want[i])
		}
	}
	if e.Topology == "" {
		t.Error("the topology decision is not said")
	}
}

func TestExplainShowsTheFlowsConntrackEntries(t *testing.T) {
	m := model(facts, svc{port("web", "10.96.0.10", v1.ProtocolTCP, 80), []proxy.Endpoint{ready("10.244.1.10", "node-a")}})
	m.Conntrack = append(m.Conntrack,
		ce("tcp", "10.244.1.99:4000", "10.96.0.10:80", "10.244.1.10:8080"),
		ce("tcp", "10.244.1.98:4000", "10.96.0.10:80", "10.244.1.10:8080"),
		ce("udp", "10.244.1.99:4000", "10.96.0.10:80", "10.244.1.10:8080"))
	p, _ := ParsePacket("10.96.0.10:80", "10.244.1.99")
	if e := Explain(m, p, Options{}); len(e.Conntrack) != 1 || e.Conntrack[0].OrigSrc != "10.244.1.99:4000" {
		t.Errorf("conntrack %+v, want the one TCP entry from 10.244.1.99", e.Conntrack)
	}
}

func TestParsePacketRefusesWhatIsNoPacket(t *testing.T) {
	for _, tc := range []struct{ dst, from, want string }{
		{"10.96.0.10", "", "want IP:PORT"},
		{"10.96.0.10:80/icmp", "", "want tcp, udp or sctp"},
		{"10.96.0.10:0", "", "port 0"},
		{"10.96.0.10:80", "not-an-ip", "--from"},
		{"10.96.0.10:80", "fd00::1", "different IP families"},
		{"[fe80::1%eth0]:80", "", "zone"},
	} {
		if _, err := ParsePacket(tc.dst, tc.from); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParsePacket(%q, %q): %v, want an error saying %q", tc.dst, tc.from, err, tc.want)
		}
	}
}
