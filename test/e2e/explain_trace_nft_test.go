package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
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

// The nftables tracer: the kernel's own record of a packet's path through
// kp's nftables rules, for comparing with what kp explain predicts.
//
// It adds a table of its own to the node's namespace (traceTable), whose
// chains at the raw priority (-400) of prerouting and output set "meta
// nftrace" on the one flow traced, runs `nft -a monitor` there, sends the
// packet, and reads the rule events of the first traced packet: each rule
// of the kept tables that matched, with its handle and verdict. A rule
// that does not match is not traced (the kernel's NFT_BREAK), nor is the
// end of a chain, so the events are the steps RuleStep describes.

// traceTable is the tracer's own table, in the packet's family.
const traceTable = "kptrace"

// traceNFT traces the first packet from `from` to dst (proto "tcp" or
// "udp") through kp's nftables table, sent by send.
func traceNFT(e *env, from netip.Addr, dst netip.AddrPort, proto string, send func()) ([]explain.RuleStep, error) {
	return traceNFTTables(e, from, dst, proto, send, "kp")
}

// traceNFTTables is traceNFT for the rules of the named tables (the
// userspace mode's redirect table is kp-userspace); none keeps every table
// but the tracer's own.
func traceNFTTables(e *env, from netip.Addr, dst netip.AddrPort, proto string, send func(), tables ...string) ([]explain.RuleStep, error) {
	fam := "ip"
	if dst.Addr().Is6() {
		fam = "ip6"
	}
	// Only the flow's first packet is traced: it puts the client in
	// set once, and later packets (retransmissions, the rest of the
	// flow) find it there. The kernel's trace id is no packet's name: it
	// changes on the way (from the bridge's hooks to the IP layer's), so
	// every event traced is the first packet's.
	flow := fmt.Sprintf("%s saddr %s %s daddr %s meta l4proto %s th dport %d", fam, from, fam, dst.Addr(), proto, dst.Port())
	rules := fmt.Sprintf("%s %s saddr @once return; %s add @once { %s saddr } meta nftrace set 1;", flow, fam, flow, fam)
	addrType := "ipv4_addr"
	if fam == "ip6" {
		addrType = "ipv6_addr"
	}
	script := fmt.Sprintf("table %s %s {\n"+
		"  set once { type %s; flags dynamic; }\n"+
		"  chain pre { type filter hook prerouting priority -400; policy accept; %s }\n"+
		"  chain out { type filter hook output priority -400; policy accept; %s }\n}\n", fam, traceTable, addrType, rules, rules)

	// The monitor is listening once it reports the tracer's table added.
	mon := exec.Command("ip", "netns", "exec", e.w.Node(), "nft", "-a", "monitor")
	out, err := mon.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr bytes.Buffer
	mon.Stderr = &stderr
	if err := mon.Start(); err != nil {
		return nil, fmt.Errorf("nft monitor: %w", err)
	}
	defer func() {
		_ = mon.Process.Kill()
		_ = mon.Wait()
	}()
	var (
		mu    sync.Mutex
		lines []string
		ready = make(chan struct{})
		done  = make(chan struct{})
	)
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		armed := false
		for sc.Scan() {
			l := sc.Text()
			if !armed && strings.HasPrefix(l, "add table "+fam+" "+traceTable) {
				armed = true
				close(ready)
			}
			if strings.HasPrefix(l, "trace id ") {
				mu.Lock()
				lines = append(lines, l)
				mu.Unlock()
			}
		}
	}()
	defer func() {
		_, _ = e.w.NFT("delete", "table", fam, traceTable)
	}()
	// The monitor may not listen yet when the table is added: add it
	// again until the monitor reports it.
	deadline := time.Now().Add(10 * time.Second)
wait:
	for {
		if err := nftScript(e, script); err != nil {
			return nil, err
		}
		select {
		case <-ready:
			break wait
		case <-done:
			return nil, fmt.Errorf("nft monitor ended: %s", stderr.String())
		case <-time.After(300 * time.Millisecond):
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("nft monitor never reported table %s %s", fam, traceTable)
			}
			if _, err := e.w.NFT("delete", "table", fam, traceTable); err != nil {
				return nil, err
			}
		}
	}
	send()
	// The first packet's events are all written by the time send has its
	// answer (or gave up); the monitor may still be reading them.
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	traced := slices.Clone(lines)
	mu.Unlock()
	if os.Getenv("KP_TRACE_DEBUG") != "" {
		e.t.Logf("trace:\n%s", strings.Join(traced, "\n"))
	}
	return parseTrace(traced, tables)
}

// nftScript loads an nft script in the node's namespace.
func nftScript(e *env, script string) error {
	cmd := exec.Command("ip", "netns", "exec", e.w.Node(), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft -f: %w: %s\n%s", err, out, script)
	}
	return nil
}

var (
	traceLine    = regexp.MustCompile(`^trace id (\S+) (ip6?|inet) (\S+) (\S+) (packet|rule|policy|verdict) ?(.*)$`)
	traceRule    = regexp.MustCompile(`^(.*) # handle (\d+) \(verdict (.*)\)$`)
	traceUnknown = regexp.MustCompile(`^unknown rule ()handle (\d+) \(verdict (.*)\)$`)
	traceDaddr   = regexp.MustCompile(`\bip6? daddr (\S+)`)
	traceDport   = regexp.MustCompile(`\b(?:tcp|udp|sctp) dport (\d+)`)
	traceQuotes  = strings.NewReplacer(`"`, "")
)

// parseTrace reads `nft -a monitor` trace lines, all of the one packet
// traced: the rule events in the kept tables (all but the tracer's own
// when tables is empty), as RuleSteps. The kernel's verdict of a rule with
// a NAT or reject statement is accept or drop; the step names the
// statement as the RulePather does: "dnat to A:P" (the address the next
// hook's packet carries), "masquerade", "reject".
func parseTrace(lines []string, tables []string) ([]explain.RuleStep, error) {
	var steps []explain.RuleStep
	pendingDNAT := -1
	for _, l := range lines {
		m := traceLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		table, chain, kind, rest := m[3], traceQuotes.Replace(m[4]), m[5], m[6]
		if kind == "packet" && pendingDNAT >= 0 {
			a, p := traceDaddr.FindStringSubmatch(rest), traceDport.FindStringSubmatch(rest)
			if a != nil && p != nil {
				addr, err1 := netip.ParseAddr(a[1])
				port, err2 := strconv.ParseUint(p[1], 10, 16)
				if err1 == nil && err2 == nil {
					steps[pendingDNAT].Verdict = "dnat to " + netip.AddrPortFrom(addr, uint16(port)).String()
				}
			}
			pendingDNAT = -1
		}
		keep := table != traceTable
		if len(tables) > 0 {
			keep = slices.Contains(tables, table)
		}
		if kind != "rule" || !keep {
			continue
		}
		// nft names a rule its cache does not hold (added after the
		// monitor started) "unknown rule handle N".
		r := traceRule.FindStringSubmatch(rest)
		if r == nil {
			r = traceUnknown.FindStringSubmatch(rest)
		}
		if r == nil {
			return steps, fmt.Errorf("trace: a rule event without handle or verdict: %q", l)
		}
		h, _ := strconv.ParseUint(r[2], 10, 64)
		s := explain.RuleStep{Where: m[2] + " " + table + " " + chain, Rule: r[1], Handle: h, Verdict: traceQuotes.Replace(r[3])}
		switch {
		case s.Verdict == "accept" && strings.Contains(s.Rule, "dnat "):
			s.Verdict = "dnat"
			pendingDNAT = len(steps)
		case s.Verdict == "accept" && strings.Contains(s.Rule, "masquerade"):
			s.Verdict = "masquerade"
		case s.Verdict == "drop" && strings.Contains(s.Rule, "reject"):
			s.Verdict = "reject"
		}
		steps = append(steps, s)
	}
	if len(lines) == 0 {
		return nil, fmt.Errorf("trace: no packet traced")
	}
	return steps, nil
}

// pathDiff compares a predicted rule path with a traced one: equal in
// length and, step by step, in Where and Verdict (a predicted "one of: a |
// b" accepts any of them), and in Handle when both have one. "" when they
// agree; else both paths, side by side.
func pathDiff(predicted explain.RulePath, traced []explain.RuleStep) string {
	want := predicted.Steps
	same := len(want) == len(traced)
	for i := 0; same && i < len(want); i++ {
		same = stepMatches(want[i], traced[i])
	}
	if same {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "predicted %d steps, the kernel traced %d:\n", len(want), len(traced))
	for i := range max(len(want), len(traced)) {
		mark := "  "
		if i >= len(want) || i >= len(traced) || !stepMatches(want[i], traced[i]) {
			mark = "≠ "
		}
		fmt.Fprintf(&b, "%s%2d predicted: %s\n     traced:    %s\n", mark, i, stepAt(want, i), stepAt(traced, i))
	}
	if predicted.Absent != "" || predicted.Note != "" {
		fmt.Fprintf(&b, "(absent: %q; note: %q)\n", predicted.Absent, predicted.Note)
	}
	return b.String()
}

func stepMatches(want, got explain.RuleStep) bool {
	if want.Where != got.Where || want.Handle != 0 && got.Handle != 0 && want.Handle != got.Handle {
		return false
	}
	if alts, ok := strings.CutPrefix(want.Verdict, "one of: "); ok {
		return slices.Contains(strings.Split(alts, " | "), got.Verdict)
	}
	return want.Verdict == got.Verdict
}

func stepAt(steps []explain.RuleStep, i int) string {
	if i >= len(steps) {
		return "-"
	}
	s := steps[i]
	return fmt.Sprintf("%s: %s # handle %d (verdict %s)", s.Where, s.Rule, s.Handle, s.Verdict)
}

// kp explain's rule path for nftables is the kernel's: for each feature
// that changes a verdict, one real packet is traced through kp's table
// (nft monitor trace) and its rule events are the steps kp explain
// predicted from the live model, rule handles included: DNAT for a
// ClusterIP from outside, from a pod and from the node, a NodePort, an
// externalIP and a LoadBalancer IP inside its source ranges; drop outside
// them; reject without endpoints, drop under traffic policy Local without
// a local endpoint; the terminating fallback, topology hints, ClientIP
// affinity, hairpin; an endpoint on the node itself (input, and from the
// node out and back in through loopback); drop for an unallocated ClusterIP, reject for a port
// the ClusterIP lacks (TCP and UDP); and a packet that is no Service's.
func TestNFTRulePathIsTheKernelsTrace(t *testing.T) {
	m := modeNFTables
	skipUnselected(t, m)
	e := newEnv(t, m, 3) // parallel
	netns.Require(t, "nft")
	pods := e.w.Pods()
	client, pod, node := e.w.ClientIP(), pods[2].IP, e.w.NodeIP()
	v4 := func(ps ...*netns.Pod) []Endpoint {
		var eps []Endpoint
		for _, p := range ps {
			eps = append(eps, Endpoint{IP: p.IP.String(), NodeName: nodeName})
		}
		return eps
	}
	const extIP, lbIP = "198.51.100.10", "198.51.100.20"
	if _, err := e.w.Exec(e.w.Client(), "ip", "route", "add", "198.51.100.0/24", "via", node.String()); err != nil {
		t.Fatal(err)
	}
	e.writeNodeInZone("zone-a")
	http := []Port{{Name: "http", Port: 80, TargetPort: 8080}}
	svcs := []Service{
		{Name: "web", Type: v1.ServiceTypeNodePort, ClusterIPs: []string{"10.96.0.10"}, ExternalIPs: []string{extIP},
			Ports: []Port{{Name: "http", Port: 80, TargetPort: 8080, NodePort: 30080}}, Endpoints: v4(pods[0], pods[1])},
		{Name: "lb", Type: v1.ServiceTypeLoadBalancer, ClusterIPs: []string{"10.96.0.11"}, LoadBalancerIPs: []string{lbIP},
			SourceRanges: []string{client.String() + "/32"}, Ports: []Port{{Name: "http", Port: 80, TargetPort: 8080, NodePort: 30081}},
			Endpoints: v4(pods[0])},
		{Name: "empty", ClusterIPs: []string{"10.96.0.20"}, Ports: http},
		{Name: "local", Type: v1.ServiceTypeNodePort, ClusterIPs: []string{"10.96.0.30"}, ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyLocal,
			Ports:     []Port{{Name: "http", Port: 80, TargetPort: 8080, NodePort: 30082}},
			Endpoints: []Endpoint{{IP: pods[1].IP.String(), NodeName: "node-b"}}},
		{Name: "rolling", ClusterIPs: []string{"10.96.0.50"}, Ports: http, Endpoints: []Endpoint{Terminating(pods[0].IP.String())}},
		{Name: "zoned", ClusterIPs: []string{"10.96.0.60"}, Ports: http, TrafficDistribution: v1.ServiceTrafficDistributionPreferClose,
			Endpoints: []Endpoint{{IP: pods[0].IP.String(), NodeName: nodeName, Zone: "zone-a", ZoneHints: []string{"zone-a"}},
				{IP: pods[1].IP.String(), NodeName: "node-b", Zone: "zone-b", ZoneHints: []string{"zone-b"}}}},
		{Name: "sticky", ClusterIPs: []string{"10.96.0.70"}, Ports: http, AffinitySeconds: 600, Endpoints: v4(pods[0], pods[1])},
		{Name: "self", ClusterIPs: []string{"10.96.0.80"}, Ports: http, Endpoints: v4(pods[2])},
		{Name: "host", ClusterIPs: []string{"10.96.0.90"}, Ports: http, Endpoints: []Endpoint{{IP: node.String(), NodeName: nodeName}}},
		{Name: "web6", ClusterIPs: []string{"fd00:96::10"}, Ports: http,
			Endpoints: []Endpoint{{IP: pods[0].IP6.String(), NodeName: nodeName}, {IP: pods[1].IP6.String(), NodeName: nodeName}}},
		{Name: "dns", ClusterIPs: []string{"10.96.0.53"}, Ports: []Port{{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, TargetPort: 5353}},
			Endpoints: v4(pods[0], pods[1])},
	}
	var objs []any
	for _, s := range svcs {
		objs = append(objs, s)
	}
	e.write("services.yaml", objs...)
	e.startKP("--service-cidrs", netns.ServiceCIDR.String()+","+netns.ServiceCIDR6.String())
	e.answers(e.w.Client(), "tcp", webTCP)

	nodePort := func(p int) string { return hostPort(node.String(), p) }
	cases := []struct {
		name    string
		ns      string
		from    netip.Addr
		dst     string // IP:PORT, /udp for UDP
		verdict explain.Verdict
	}{
		{"ClusterIP from outside the cluster", e.w.Client(), client, webTCP, explain.VerdictDNAT},
		{"ClusterIP from a pod", pods[2].NS, pod, webTCP, explain.VerdictDNAT},
		{"ClusterIP from the node itself", e.w.Node(), node, webTCP, explain.VerdictDNAT},
		{"NodePort", e.w.Client(), client, nodePort(30080), explain.VerdictDNAT},
		{"externalIP", e.w.Client(), client, extIP + ":80", explain.VerdictDNAT},
		{"LoadBalancer IP inside its source ranges", e.w.Client(), client, lbIP + ":80", explain.VerdictDNAT},
		{"LoadBalancer IP outside its source ranges", pods[2].NS, pod, lbIP + ":80", explain.VerdictDrop},
		{"no endpoints", e.w.Client(), client, "10.96.0.20:80", explain.VerdictReject},
		{"traffic policy Local without a local endpoint", e.w.Client(), client, nodePort(30082), explain.VerdictDrop},
		{"terminating fallback", e.w.Client(), client, "10.96.0.50:80", explain.VerdictDNAT},
		{"topology hints", e.w.Client(), client, "10.96.0.60:80", explain.VerdictDNAT},
		{"ClientIP affinity", e.w.Client(), client, "10.96.0.70:80", explain.VerdictDNAT},
		{"hairpin", pods[2].NS, pod, "10.96.0.80:80", explain.VerdictDNAT},
		{"an endpoint on the node itself: input", e.w.Client(), client, "10.96.0.90:80", explain.VerdictDNAT},
		{"from the node to an endpoint on it: back in through loopback", e.w.Node(), node, "10.96.0.90:80", explain.VerdictDNAT},
		{"IPv6 ClusterIP from outside the cluster", e.w.Client(), e.w.ClientIP6(), "[fd00:96::10]:80", explain.VerdictDNAT},
		{"UDP ClusterIP", pods[2].NS, pod, "10.96.0.53:53/udp", explain.VerdictDNAT},
		{"unallocated ClusterIP", e.w.Client(), client, "10.96.0.99:80", explain.VerdictDrop},
		{"a port the ClusterIP lacks", e.w.Client(), client, "10.96.0.10:81", explain.VerdictReject},
		{"a UDP port the ClusterIP lacks", e.w.Client(), client, "10.96.0.53:54/udp", explain.VerdictReject},
		{"no Service", pods[2].NS, pod, "192.0.2.1:80", explain.VerdictNotKPs},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			x := e.explainJSON("", tc.from.String(), tc.dst)
			if x.Verdict != tc.verdict {
				t.Fatalf("kp explain: %s (%s); want %s", x.Verdict, x.Why, tc.verdict)
			}
			addr, proto, _ := strings.Cut(tc.dst, "/")
			if proto == "" {
				proto = "tcp"
			}
			dst := netip.MustParseAddrPort(addr)
			traced, err := traceNFT(e, tc.from, dst, proto, func() { _, _ = e.w.Dial(tc.ns, proto, addr, 2*time.Second) })
			if err != nil {
				t.Fatal(err)
			}
			if d := pathDiff(x.RulePath, traced); d != "" {
				t.Errorf("kp explain's rule path is not the kernel's trace:\n%s", d)
			}
			if !slices.ContainsFunc(x.RulePath.Steps, func(s explain.RuleStep) bool { return s.Handle != 0 }) {
				t.Errorf("no step has a rule handle (note: %s)", x.RulePath.Note)
			}
		})
	}
}
