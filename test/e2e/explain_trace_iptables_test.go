package e2e

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/explain"
	"github.com/kpproxy/kp/test/netns"
)

// The iptables tracer: what the kernel says a first packet met of kp's
// iptables chains (any KP- chain: the iptables mode's, the ipvs mode's
// KP-IPVS-, the userspace mode's KP-USERSPACE- redirects), as
// explain.RuleSteps named as the RulePathers name them: Where "nat
// KP-SERVICES", Verdict "jump KP-SVC-…", "dnat to A:P", "masquerade".

// traceIPTables arms the kernel's record for the first packet from `from`
// to dst (proto "tcp" or "udp") in e's node namespace, calls send (which
// sends it and must not wait for an answer), disarms, and returns the
// rules of kp's that packet matched, in the order the kernel evaluated
// them.
func traceIPTables(e *env, from netip.Addr, dst netip.AddrPort, proto string, send func()) ([]explain.RuleStep, error) {
	switch {
	case e.mode.backend == "nft" && dst.Addr().Is4():
		return traceXtablesMonitor(e, from, dst, proto, send)
	case e.mode.backend == "nft":
		// xtables-monitor 1.8.9 cannot print an IPv6 rule with a
		// protocol match ("unsupported layer 4 protocol value", then it
		// exits), and every rule of kp's service chains has one:
		// iptables-nft's counters are the record for IPv6.
		return traceCounters(e, from, dst, proto, send, "ip6tables-nft")
	case e.mode.backend == "legacy":
		return traceCounters(e, from, dst, proto, send, iptFamily(dst)+"-legacy")
	}
	return nil, fmt.Errorf("mode %s has no iptables backend to trace", e.mode.name)
}

// iptFamily is "iptables" or "ip6tables" for the destination's family.
func iptFamily(dst netip.AddrPort) string {
	if dst.Addr().Is4() {
		return "iptables"
	}
	return "ip6tables"
}

// flowMatch matches the flow's original direction: its first packet and
// its retransmissions (TCP: the SYN only).
func flowMatch(from netip.Addr, dst netip.AddrPort, proto string) []string {
	m := []string{"-s", from.String(), "-d", dst.Addr().String(), "-p", proto, "-m", proto, "--dport", strconv.Itoa(int(dst.Port()))}
	if proto == "tcp" {
		m = append(m, "--syn")
	}
	return append(m, "-m", "comment", "--comment", "kp e2e trace")
}

// testRules inserts rules of the test's own into the node namespace and
// returns their removal; each is "TABLE CHAIN" with its spec.
func testRules(e *env, bin string, rules map[[2]string][]string) (func(), error) {
	var added [][]string
	undo := func() {
		for _, r := range added {
			if out, err := e.w.Exec(e.w.Node(), append([]string{bin, "-t", r[0], "-D", r[1]}, r[2:]...)...); err != nil {
				e.t.Logf("remove the trace's rule: %v\n%s", err, out)
			}
		}
	}
	for where, spec := range rules {
		if out, err := e.w.Exec(e.w.Node(), append([]string{bin, "-t", where[0], "-I", where[1], "1"}, spec...)...); err != nil {
			undo()
			return nil, fmt.Errorf("%v\n%s", err, out)
		}
		added = append(added, append([]string{where[0], where[1]}, spec...))
	}
	return undo, nil
}

// traceXtablesMonitor is iptables-nft's own trace: TRACE rules of the
// test's, in raw PREROUTING (packets that arrive) and raw OUTPUT (the
// node's own), matching that flow only, set the packet's nftrace bit;
// xtables-monitor --trace prints every rule the traced packet matches.
// Only the first traced packet (its trace id) is kept.
func traceXtablesMonitor(e *env, from netip.Addr, dst netip.AddrPort, proto string, send func()) ([]explain.RuleStep, error) {
	bin := iptFamily(dst) + "-nft"
	trace := append(flowMatch(from, dst, proto), "-j", "TRACE")
	undo, err := testRules(e, bin, map[[2]string][]string{{"raw", "PREROUTING"}: trace, {"raw", "OUTPUT"}: trace})
	if err != nil {
		return nil, fmt.Errorf("arm the trace: %w", err)
	}
	defer undo()
	// Line-buffered: xtables-monitor writes to a pipe through stdio's
	// block buffer, whose unflushed tail a SIGTERM loses (a trace cut
	// after its nat steps, once).
	mon := exec.Command("ip", "netns", "exec", e.w.Node(), "stdbuf", "-oL", "xtables-monitor", "--trace")
	if !dst.Addr().Is4() {
		mon.Args = append(mon.Args, "-6")
	} else {
		mon.Args = append(mon.Args, "-4")
	}
	var out syncBuffer
	mon.Stdout, mon.Stderr = &out, &out
	if err := mon.Start(); err != nil {
		return nil, fmt.Errorf("xtables-monitor: %w", err)
	}
	// xtables-monitor subscribes at once but says nothing until an
	// event: give it a moment before the packet.
	time.Sleep(500 * time.Millisecond)
	send()
	// send does not wait for the packet: wait until the trace has begun
	// and then been quiet for 300 ms (at most 3 s).
	last, quiet := 0, time.Now()
	for deadline := time.Now().Add(slow(3 * time.Second)); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if n := len(out.String()); n != last {
			last, quiet = n, time.Now()
		} else if n > 0 && time.Since(quiet) > 300*time.Millisecond {
			break
		}
	}
	_ = mon.Process.Signal(syscall.SIGTERM)
	_ = mon.Wait()
	if os.Getenv("KP_E2E_TRACE_LOG") != "" {
		e.t.Logf("xtables-monitor --trace:\n%s", out.String())
	}
	return parseXtablesTrace(out.String())
}

// parseXtablesTrace reads xtables-monitor --trace's lines of the first
// traced packet, e.g.
//
//	PACKET: 2 470d892b IN=kpbr0 … SRC=10.100.1.10 DST=203.0.113.99 … ID=39728 DF SPORT=33784 DPORT=80 SYN
//	 TRACE: 2 470d892b nat:KP-SERVICES:rule:0x5:JUMP:KP-SVC-X  -4 -t nat -A KP-SERVICES … -j KP-SVC-X
//
// keeping the rules of kp's chains and the jumps into them. The trace id
// is not the packet's for its whole path (a packet the bridge passes up,
// br_netfilter, gets another from the FORWARD hook on), so the packet is
// told by what DNAT leaves alone: its source, source port and IP ID.
func parseXtablesTrace(text string) ([]explain.RuleStep, error) {
	var steps []explain.RuleStep
	var first string
	ids := map[string]bool{}
	// A line may run into the next event's (the monitor ends a line
	// when the next begins): one event a line.
	text = strings.NewReplacer("TRACE: ", "\nTRACE: ", "PACKET: ", "\nPACKET: ").Replace(text)
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		ev := strings.TrimSpace(sc.Text())
		f := strings.Fields(ev)
		if len(f) < 4 {
			continue
		}
		if f[0] == "PACKET:" {
			key := packetKey(f)
			if first == "" {
				first = key
			}
			if key == first {
				ids[f[2]] = true
			}
			continue
		}
		if f[0] != "TRACE:" || !ids[f[2]] {
			continue
		}
		// f[3]: TABLE:CHAIN:rule:HANDLE:VERDICT[:TARGET]
		p := strings.SplitN(f[3], ":", 6)
		if len(p) < 5 || p[2] != "rule" {
			continue // a chain's return or policy: no rule
		}
		table, chain, verdict := p[0], p[1], p[4]
		tgt := ""
		if len(p) == 6 {
			tgt = p[5]
		}
		if !strings.HasPrefix(chain, "KP-") && !strings.HasPrefix(tgt, "KP-") {
			continue
		}
		handle, _ := strconv.ParseUint(strings.TrimPrefix(p[3], "0x"), 16, 64)
		rule := ""
		if i := strings.Index(ev, " -A "); i >= 0 {
			rule = strings.TrimSpace(ev[i+1:])
		}
		steps = append(steps, explain.RuleStep{Where: table + " " + chain, Rule: rule, Handle: handle,
			Verdict: traceVerdict(verdict, tgt, rule)})
	}
	if first == "" {
		return nil, fmt.Errorf("xtables-monitor saw no traced packet:\n%s", text)
	}
	return steps, nil
}

// packetKey is what of a PACKET line no hook of kp's changes before
// POSTROUTING's SNAT: SRC=, SPORT= and (IPv4) ID=.
func packetKey(f []string) string {
	var k []string
	for _, w := range f {
		if strings.HasPrefix(w, "SRC=") || strings.HasPrefix(w, "SPORT=") || strings.HasPrefix(w, "ID=") {
			k = append(k, w)
		}
	}
	return strings.Join(k, " ")
}

// traceVerdict spells the kernel's verdict as explain does: the jump or
// goto with its chain, and a terminal verdict by the target that gave it
// (an iptables DNAT, MASQUERADE or REJECT ends in accept or drop).
func traceVerdict(verdict, tgt, rule string) string {
	switch verdict {
	case "JUMP":
		return "jump " + tgt
	case "GOTO":
		return "goto " + tgt
	case "CONTINUE":
		return "continue"
	case "RETURN", "0xfffffffb": // NFT_RETURN, which xtables-monitor prints as a number
		return "return"
	}
	if v := terminalVerdict(rule); v != "" {
		return v
	}
	return strings.ToLower(verdict)
}

// terminalVerdict is the verdict of a rule's terminal target ("" for
// others): "dnat to A:P", "redirect to :P", "masquerade", "reject",
// "drop", "accept", "return".
func terminalVerdict(spec string) string {
	f := strings.Fields(spec)
	for i := 0; i+1 < len(f); i++ {
		if f[i] != "-j" {
			continue
		}
		switch f[i+1] {
		case "DNAT":
			for k := i + 2; k+1 < len(f); k++ {
				if f[k] == "--to-destination" {
					return "dnat to " + f[k+1]
				}
			}
			return "dnat"
		case "MASQUERADE":
			return "masquerade"
		case "REDIRECT": // the userspace mode's redirects, nftables trace style
			for k := i + 2; k+1 < len(f); k++ {
				if f[k] == "--to-ports" {
					return "redirect to :" + f[k+1]
				}
			}
			return "redirect"
		case "REJECT", "DROP", "ACCEPT", "RETURN":
			return strings.ToLower(f[i+1])
		}
	}
	return ""
}

// kp explain's rule path is the one the kernel walks, in the iptables
// mode with either backend: for each case a real first packet is traced
// (traceIPTables) and compared with the path kp explain -o json predicted
// for it (pathDiff); a random endpoint choice accepts any of its
// alternatives.
func TestIPTablesRulePathIsTheKernelsTrace(t *testing.T) {
	forEachModeOf(t, mode.iptables, func(t *testing.T, m mode) {
		e := newEnv(t, m, 2)
		pods := e.w.Pods()
		http := []Port{{Name: "http", Port: 80, TargetPort: 8080}}
		svc := web(pods...)
		svc.Type, svc.Ports[0].NodePort, svc.ExternalIPs = v1.ServiceTypeNodePort, 30080, []string{"203.0.113.10"}
		one := Service{Name: "one", ClusterIPs: []string{"10.96.0.11", "fd00:96::11"}, Ports: http, Endpoints: endpoints(pods[1])}
		empty := Service{Name: "empty", ClusterIPs: []string{"10.96.0.20"}, Ports: http}
		elsewhere := endpoints(pods[0])
		for i := range elsewhere {
			elsewhere[i].NodeName = "node-b"
		}
		local := Service{Name: "local", Type: v1.ServiceTypeNodePort, ClusterIPs: []string{"10.96.0.30"},
			Ports: []Port{{Name: "http", Port: 80, TargetPort: 8080, NodePort: 30090}}, Endpoints: elsewhere,
			ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyLocal}
		client := e.w.ClientIP()
		fw := Service{Name: "fw", Type: v1.ServiceTypeLoadBalancer, ClusterIPs: []string{"10.96.0.40"},
			Ports: []Port{{Name: "http", Port: 80, TargetPort: 8080, NodePort: 30100}}, Endpoints: endpoints(pods...),
			LoadBalancerIPs: []string{"203.0.113.40"}, SourceRanges: []string{client.String() + "/32"}}
		sticky := Service{Name: "sticky", ClusterIPs: []string{"10.96.0.50"}, Ports: http, Endpoints: endpoints(pods...),
			AffinitySeconds: 600}
		// Enough ClusterIPs that kp splits its dispatch chains into
		// tries (KP-SVCS-…, KP-FSVCS-…; legacy/iptables/dispatch.go): the
		// path walks them.
		terminating := Service{Name: "terminating", ClusterIPs: []string{"10.96.0.60"}, Ports: http,
			Endpoints: []Endpoint{{IP: pods[1].IP.String(), NodeName: nodeName, Ready: Bool(false), Serving: Bool(true), Terminating: Bool(true)}}}
		services := []any{svc, one, empty, local, fw, sticky, terminating}
		for i := range 20 {
			services = append(services, Service{Name: fmt.Sprintf("filler-%d", i), ClusterIPs: []string{fmt.Sprintf("10.96.2.%d", i+1)},
				Ports: http, Endpoints: endpoints(pods[1])})
		}
		e.write("services.yaml", services...)
		e.startKP("--service-cidrs", netns.ServiceCIDR.String()+","+netns.ServiceCIDR6.String())
		// External and LoadBalancer addresses outside the Service CIDR,
		// which the client routes through the node as a router would.
		if out, err := e.w.Exec(e.w.Client(), "ip", "route", "add", "203.0.113.0/24", "via", e.w.NodeIP().String()); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		node, pod := e.w.NodeIP(), pods[0].IP
		nodePort := func(p uint16) string { return netip.AddrPortFrom(node, p).String() }
		cases := []struct {
			name, ns string
			from     netip.Addr
			dst      string
			// through is a chain the trace must pass (the case's point).
			through string
		}{
			{"ClusterIP from off the node, masqueraded", e.w.Client(), client, "10.96.0.11:80", ""},
			{"ClusterIP from a pod, not masqueraded", pods[0].NS, pod, "10.96.0.11:80", ""},
			{"ClusterIP from the node", e.w.Node(), node, "10.96.0.11:80", ""},
			{"IPv6 ClusterIP from off the node", e.w.Client(), e.w.ClientIP6(), "[fd00:96::11]:80", ""},
			{"a filler's ClusterIP, through the dispatch trie", e.w.Client(), client, "10.96.2.7:80", "nat KP-SVCS-"},
			{"ClusterIP from a pod that is an endpoint: hairpin", pods[0].NS, pod, webTCP, ""},
			{"NodePort", e.w.Client(), client, nodePort(30080), ""},
			{"externalIP", e.w.Client(), client, "203.0.113.10:80", ""},
			{"LoadBalancer, source range allows", e.w.Client(), client, "203.0.113.40:80", ""},
			{"LoadBalancer, source range refuses", pods[0].NS, pod, "203.0.113.40:80", ""},
			{"no endpoints: rejected", e.w.Client(), client, "10.96.0.20:80", ""},
			{"NodePort, Local policy without a local endpoint: dropped", e.w.Client(), client, nodePort(30090), ""},
			{"a port the ClusterIP lacks: rejected", e.w.Client(), client, "10.96.0.11:81", ""},
			{"unallocated ClusterIP: dropped", e.w.Client(), client, "10.96.0.99:80", ""},
			{"ClientIP affinity", e.w.Client(), client, "10.96.0.50:80", ""},
			// The case before set the client's entry (KP-SEP-'s --set):
			// now the --rcheck rule picks, one of the same alternatives.
			{"ClientIP affinity, the client pinned", e.w.Client(), client, "10.96.0.50:80", ""},
			{"only a terminating endpoint: the serving fallback", e.w.Client(), client, "10.96.0.60:80", ""},
			{"no Service", pods[0].NS, pod, "203.0.113.99:80", ""},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				// The client gives up before TCP's first retransmission
				// (1 s), and the next case waits for it: a SYN sent
				// again would count in the next case's counters.
				var sent sync.WaitGroup
				defer sent.Wait()
				dst := netip.MustParseAddrPort(tc.dst)
				x := e.explainJSON("", tc.from.String(), tc.dst)
				// A snapshot of this moment (the affinity entries a case
				// before left are in it, as in the live answer).
				snapFile := filepath.Join(t.TempDir(), "node.kpsnap.json")
				if _, stderr, code := e.runKP("snapshot", "-o", snapFile, "--status-socket", e.socket); code != 0 {
					t.Fatalf("kp snapshot: exit %d\n%s", code, stderr)
				}
				if len(x.RulePath.Steps) == 0 {
					t.Fatalf("kp explain predicts no rule path: %s", x.RulePath.Absent)
				}
				steps, err := traceIPTables(e, tc.from, dst, "tcp", func() {
					sent.Add(1)
					go func() {
						defer sent.Done()
						_, _ = netns.Dial(tc.ns, "tcp", tc.dst, 900*time.Millisecond)
					}()
				})
				if err != nil {
					t.Fatal(err)
				}
				if len(steps) == 0 {
					t.Fatalf("the kernel's trace shows no rule of kp's for %s from %s", tc.dst, tc.from)
				}
				if d := pathDiff(x.RulePath, steps); d != "" {
					t.Errorf("kp explain's rule path is not the kernel's (%s): %s", x.Verdict, d)
				}
				// iptables-legacy-save prints the rules as the snapshot
				// listed them: each traced rule is a predicted step's text.
				for _, st := range steps {
					if m.backend == "legacy" && !slices.ContainsFunc(x.RulePath.Steps, func(p explain.RuleStep) bool {
						return slices.Contains(strings.Split(p.Rule, " | "), st.Rule)
					}) {
						t.Errorf("the traced rule %q is no predicted step's text", st.Rule)
					}
				}
				// Offline, from the snapshot's file, the path is the same.
				if off := e.explainJSON(snapFile, tc.from.String(), tc.dst); !reflect.DeepEqual(off.RulePath, x.RulePath) {
					t.Errorf("from the snapshot, the path is\n%+v\nlive\n%+v", off.RulePath, x.RulePath)
				}
				if tc.through != "" && !slices.ContainsFunc(steps, func(s explain.RuleStep) bool { return strings.HasPrefix(s.Where, tc.through) }) {
					t.Errorf("the trace never passes %s…: the case does not test what it says", tc.through)
				}
			})
		}
	})
}
