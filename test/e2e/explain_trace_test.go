package e2e

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/explain"
	"github.com/kpproxy/kp/test/netns"
)

// tracer arms the kernel's own trace of the rules in e's node for the
// first packet from `from` to dst over proto ("tcp" or "udp"), calls send,
// disarms, and returns the steps the kernel reports for kp's rules, named
// as the mode's RulePather names them. The traced connection need not
// complete (iptables-legacy's tracer holds its replies back).
type tracer func(e *env, from netip.Addr, dst netip.AddrPort, proto string, send func()) ([]explain.RuleStep, error)

// tracer is the mode's: nftables tracing for kp's tables, iptables TRACE
// (iptables-nft) or rule counters (iptables-legacy) for its chains, and
// for ipvs and userspace those of their rules plus the kernel's record of
// the virtual server or listener the connection met.
func (e *env) tracer() tracer {
	switch {
	case e.mode.ipvs:
		return traceIPVS
	case e.mode.userspace:
		return traceUserspace
	case e.mode.iptables():
		return traceIPTables
	}
	return traceNFT
}

// A packet for every row of the feature table that changes a verdict: kp
// explain's rule path for it (live, from the running proxy) is the one the
// kernel's trace shows the packet took, step by step, and its verdict the
// one the packet met (an answer, a refusal, or silence).
func TestExplainedRulePathIsTheKernelsTrace(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 4)
		pods := e.w.Pods()
		client, clientNS := e.w.ClientIP(), e.w.Client()
		const lbIP, extIP = "10.96.200.1", "10.96.201.1"

		e.writeNodeInZone("zone-a")
		svc := web(pods[0], pods[1])
		svc.Type = v1.ServiceTypeLoadBalancer
		svc.Ports[0].NodePort, svc.Ports[1].NodePort = 30080, 30053
		svc.ExternalIPs, svc.LoadBalancerIPs = []string{extIP}, []string{lbIP}
		svc.SourceRanges = []string{client.String() + "/32"}
		http := func(name, ip string, eps ...Endpoint) Service {
			return Service{Name: name, ClusterIPs: []string{ip}, Ports: []Port{{Name: "http", Port: 80, TargetPort: 8080}},
				Endpoints: eps}
		}
		local := http("local", "10.96.0.30", onNode(otherNode, endpoints(pods[3]))...)
		local.Type, local.ExternalTrafficPolicy = v1.ServiceTypeNodePort, v1.ServiceExternalTrafficPolicyLocal
		local.Ports[0].NodePort = 30081
		zoned := func(p *netns.Pod, zone string) Endpoint {
			return Endpoint{IP: p.IP.String(), NodeName: otherNode, Zone: zone, ZoneHints: []string{zone}}
		}
		affinity := http("affinity", "10.96.0.60", endpoints(pods[0], pods[1])...)
		affinity.AffinitySeconds = 300
		e.write("web.yaml", svc, http("empty", "10.96.0.20"), local,
			http("terminating", "10.96.0.40", Terminating(pods[0].IP.String()), Terminating(pods[1].IP.String())),
			http("zoned", "10.96.0.50", zoned(pods[0], "zone-a"), zoned(pods[1], "zone-b")),
			affinity, http("hairpin", "10.96.0.70", endpoints(pods[2])...))
		e.startKP("--service-cidrs", netns.ServiceCIDR.String())
		e.answers(clientNS, "tcp", webTCP)
		nodeIP := e.w.NodeIP().String()
		// The ipvs mode refuses where the Local policy has no endpoint
		// (its virtual server has no real server), as upstream's does.
		localNone := explain.VerdictDrop
		if !m.claims(featureLocalPolicyInternalReach) {
			localNone = explain.VerdictReject
		}

		cases := []struct {
			name string
			// ns sends from the address from.
			ns    string
			from  netip.Addr
			proto string
			dst   string
			// before runs first: a connection that leaves state behind
			// (an affinity entry).
			before  func()
			verdict explain.Verdict
		}{
			{name: "ClusterIP from outside the cluster", ns: clientNS, from: client, dst: webTCP, verdict: explain.VerdictDNAT},
			{name: "ClusterIP from a pod", ns: pods[2].NS, from: pods[2].IP, dst: webTCP, verdict: explain.VerdictDNAT},
			{name: "ClusterIP from the node", ns: e.w.Node(), from: e.nodeSource(webTCP), dst: webTCP, verdict: explain.VerdictDNAT},
			{name: "ClusterIP over UDP", ns: clientNS, from: client, proto: "udp", dst: webUDP, verdict: explain.VerdictDNAT},
			{name: "NodePort", ns: clientNS, from: client, dst: hostPort(nodeIP, 30080), verdict: explain.VerdictDNAT},
			{name: "externalIP", ns: clientNS, from: client, dst: extIP + ":80", verdict: explain.VerdictDNAT},
			{name: "LoadBalancer IP inside its source ranges", ns: clientNS, from: client, dst: lbIP + ":80",
				verdict: explain.VerdictDNAT},
			{name: "LoadBalancer IP outside its source ranges", ns: pods[2].NS, from: pods[2].IP, dst: lbIP + ":80",
				verdict: explain.VerdictDrop},
			{name: "a port the ClusterIP lacks", ns: clientNS, from: client, dst: "10.96.0.10:81", verdict: explain.VerdictReject},
			{name: "a Service without endpoints", ns: clientNS, from: client, dst: "10.96.0.20:80", verdict: explain.VerdictReject},
			{name: "traffic policy Local without a local endpoint", ns: clientNS, from: client, dst: hostPort(nodeIP, 30081),
				verdict: localNone},
			{name: "terminating endpoints as a fallback", ns: clientNS, from: client, dst: "10.96.0.40:80",
				verdict: explain.VerdictDNAT},
			{name: "topology hints", ns: clientNS, from: client, dst: "10.96.0.50:80", verdict: explain.VerdictDNAT},
			{name: "ClientIP affinity", ns: clientNS, from: client, dst: "10.96.0.60:80", verdict: explain.VerdictDNAT,
				before: func() { e.answers(clientNS, "tcp", "10.96.0.60:80") }},
			{name: "hairpin", ns: pods[2].NS, from: pods[2].IP, dst: "10.96.0.70:80", verdict: explain.VerdictDNAT},
			{name: "an unallocated ClusterIP", ns: clientNS, from: client, dst: "10.96.0.99:80", verdict: explain.VerdictDrop},
			{name: "a node port no Service has", ns: clientNS, from: client, dst: hostPort(nodeIP, 30999),
				verdict: explain.VerdictNotKPs},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				proto := tc.proto
				if proto == "" {
					proto = "tcp"
				}
				if tc.before != nil {
					tc.before()
				}
				x := e.explainJSON("", tc.from.String(), tc.dst+"/"+proto)
				if x.Verdict != tc.verdict {
					t.Errorf("explain: %s (%s), want %s", x.Verdict, x.Why, tc.verdict)
				}
				// A path is explained, or said absent because no rule of
				// kp's is on it (then the trace must show none either).
				if x.RulePath.Mode != m.proxyMode || x.RulePath.Absent != "" && (len(x.RulePath.Steps) > 0 || x.Verdict != explain.VerdictNotKPs) {
					t.Fatalf("explain gives no %s rule path: mode %q, %s", m.proxyMode, x.RulePath.Mode, x.RulePath.Absent)
				}
				// send does not wait for the answer: a tracer may hold the
				// flow's other packets back while it reads the kernel
				// (iptables-legacy's counters), and the connection then
				// completes with TCP's first retransmission, after the
				// trace; the case waits for it.
				var sent sync.WaitGroup
				traced, err := e.tracer()(e, tc.from, netip.MustParseAddrPort(tc.dst), proto, func() {
					sent.Go(func() { _, _ = e.w.Dial(tc.ns, proto, tc.dst, slow(5*time.Second)) })
				})
				sent.Wait()
				if err != nil {
					t.Fatalf("trace: %v", err)
				}
				if d := pathDiff(x.RulePath, traced); d != "" {
					t.Errorf("explain's rule path is not the kernel's trace: %s\n%s", d, e.traceRecord)
				}
				// The verdict, from the client's side, on a connection of
				// its own (the traced one may have been held back).
				reply, err := e.w.Dial(tc.ns, proto, tc.dst, time.Second)
				if met := verdictMet(reply, err); !sameOutcome(tc.verdict, met) {
					t.Errorf("the packet met %s (%q, %v); explain said %s", met, reply, err, tc.verdict)
				}
				// Silence is also what a packet meets that the node let
				// through to where nothing answers (the client, which does
				// not forward): a drop is the node's only when no
				// connection of the case went beyond it, which a confirmed
				// conntrack entry of theirs would tell.
				if tc.verdict == explain.VerdictDrop {
					if passed := e.passedNode(tc.from, netip.MustParseAddrPort(tc.dst), proto); passed != "" {
						t.Errorf("explain said drop, but the node let the connections through (its conntrack entries):\n%s\n%s",
							passed, e.traceRecord)
					}
				}
			})
		}
	})
}

// verdictMet is what a connection met, as its client sees it: an answer
// (DNAT, or not kp's: something answered), a refusal, or silence.
func verdictMet(reply string, err error) string {
	switch {
	case err == nil && reply != "":
		return "an answer"
	case isRefused(err):
		return "a refusal"
	case isTimeout(err):
		return "silence"
	}
	return "an error"
}

// sameOutcome: DNAT is answered, reject refused, drop silent; a packet
// that is not kp's meets whatever the node does with it (here: nothing
// listens on the port, so a refusal).
func sameOutcome(v explain.Verdict, met string) bool {
	switch v {
	case explain.VerdictDNAT:
		return met == "an answer"
	case explain.VerdictReject:
		return met == "a refusal"
	case explain.VerdictDrop:
		return met == "silence"
	}
	return met == "a refusal" || met == "silence"
}

// nodeSource is the source address the node's own connection to dst
// takes: the route's (in the ipvs mode a ClusterIP is local, and the
// connection comes from the ClusterIP itself).
func (e *env) nodeSource(dst string) netip.Addr {
	e.t.Helper()
	ap := netip.MustParseAddrPort(dst)
	out, err := e.w.Exec(e.w.Node(), "ip", "-o", "route", "get", ap.Addr().String())
	if err != nil {
		e.t.Fatalf("ip route get %s: %v\n%s", ap.Addr(), err, out)
	}
	f := strings.Fields(out)
	if i := slices.Index(f, "src"); i >= 0 && i+1 < len(f) {
		if a, err := netip.ParseAddr(f[i+1]); err == nil {
			return a
		}
	}
	e.t.Fatalf("ip route get %s: no source in %q", ap.Addr(), out)
	return netip.Addr{}
}

// passedNode lists the node's conntrack entries of connections from from
// to dst that went beyond the node: a connection whose first packet was
// dropped leaves no entry, and one the node took itself (the userspace
// mode's listener, which drops after the handshake) answers from one of
// the node's addresses.
func (e *env) passedNode(from netip.Addr, dst netip.AddrPort, proto string) string {
	e.t.Helper()
	out, err := e.w.Exec(e.w.Node(), "conntrack", "-L", "-p", proto, "-s", from.String(), "-d", dst.Addr().String(),
		"--dport", strconv.Itoa(int(dst.Port())))
	if err != nil {
		e.t.Fatalf("list the node's conntrack entries from %s to %s: %v\n%s", from, dst, err, out)
	}
	local, err := nodeAddrs(e)
	if err != nil {
		e.t.Fatal(err)
	}
	var passed []string
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, proto+" ") {
			continue
		}
		// The second src= is the reply's: where the connection went.
		var srcs []netip.Addr
		for _, f := range strings.Fields(line) {
			if a, ok := strings.CutPrefix(f, "src="); ok {
				if ip, err := netip.ParseAddr(a); err == nil {
					srcs = append(srcs, ip)
				}
			}
		}
		if len(srcs) != 2 || !slices.Contains(local, srcs[1]) {
			passed = append(passed, line)
		}
	}
	return strings.Join(passed, "\n")
}
