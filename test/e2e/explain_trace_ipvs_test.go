package e2e

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/explain"
	"github.com/kpproxy/kp/legacy/userspace"
	"github.com/kpproxy/kp/test/netns"
)

// The tracers of the ipvs and userspace modes (the tracer contract of
// TestExplainedRulePathIsTheKernelsTrace): each is the trace of the
// iptables or nftables rules the mode writes (traceIPTables, traceNFT),
// with the step those rules lead to read from the kernel's own record of
// the flow: the connection IPVS made (ipvsadm -Lnc), or the conntrack
// entries of the redirect and of the listener's connection onwards.

// traceIPVS traces the KP-IPVS- chains with traceIPTables and adds the
// virtual server's step where IPVS takes the packet: after the INPUT
// hook's rules (IPVS's hook runs after the filter table's), before what it
// sends on to the real server meets OUTPUT and POSTROUTING. The step's
// verdict is the real server of the connection IPVS made for the flow
// (new in ipvsadm -Lnc); with none, "reject" when the virtual server has
// no real server (IPVS answers ICMP port unreachable).
func traceIPVS(e *env, from netip.Addr, dst netip.AddrPort, proto string, send func()) ([]explain.RuleStep, error) {
	var before, after []ipvsConn
	var readErr error
	bin := iptFamily(dst) + "-" + e.mode.backend
	steps, err := traceIPTables(e, from, dst, proto, func() {
		before, readErr = ipvsConns(e)
		if e.mode.backend == "nft" && readErr == nil {
			readErr = zeroCounters(e, bin)
		}
		send()
		time.Sleep(200 * time.Millisecond) // send does not wait for the answer
		if readErr == nil {
			after, readErr = ipvsConns(e)
		}
	})
	if err != nil {
		return nil, err
	}
	if readErr != nil {
		return nil, readErr
	}
	if e.mode.backend == "nft" {
		if steps, err = withReturns(e, bin, steps); err != nil {
			return nil, err
		}
	}
	step, ok, err := ipvsStep(e, from, dst, proto, before, after)
	if err != nil || !ok {
		return steps, err
	}
	at := slices.IndexFunc(steps, func(s explain.RuleStep) bool {
		return s.Where == "filter OUTPUT" || s.Where == "nat POSTROUTING"
	})
	if at < 0 {
		at = len(steps)
	}
	return slices.Insert(steps, at, step), nil
}

func zeroCounters(e *env, bin string) error {
	for _, t := range []string{"nat", "filter"} {
		if out, err := e.w.Exec(e.w.Node(), bin, "-t", t, "-Z"); err != nil {
			return fmt.Errorf("zero the %s counters: %w\n%s", t, err, out)
		}
	}
	return nil
}

// withReturns adds the -j RETURN rules the packet matched to an
// iptables-nft trace: a kernel before 6.2 (the VM's 6.1) reports such a
// rule as a chain's return event without its handle, which xtables-monitor
// prints as it prints the end of a chain. The rules' counters (zeroed
// before the packet) tell which RETURN rule of a chain the trace entered
// matched; its step goes after the chain's (and the chains it called)
// steps, where the packet went back to the caller.
func withReturns(e *env, bin string, steps []explain.RuleStep) ([]explain.RuleStep, error) {
	counted := map[string]map[string][]countedRule{}
	for _, t := range []string{"nat", "filter"} {
		out, err := e.w.Exec(e.w.Node(), bin+"-save", "-c", "-t", t)
		if err != nil {
			return nil, fmt.Errorf("%s-save: %w\n%s", bin, err, out)
		}
		counted[t] = parseCounted(out)
	}
	for j := 0; j < len(steps); j++ {
		chain, ok := strings.CutPrefix(steps[j].Verdict, "jump ")
		if !ok {
			continue
		}
		table, _, _ := strings.Cut(steps[j].Where, " ")
		where := table + " " + chain
		var ret *countedRule
		for i, r := range counted[table][chain] {
			if tgt, _ := specTarget(r.spec); tgt == "RETURN" && r.packets > 0 {
				ret = &counted[table][chain][i]
				break
			}
		}
		k := j + 1
		for k < len(steps) && steps[k].Where != steps[j].Where && strings.Contains(steps[k].Where, " KP-") {
			k++
		}
		if ret == nil || slices.ContainsFunc(steps[j+1:k], func(s explain.RuleStep) bool { return s.Where == where && s.Verdict == "return" }) {
			continue
		}
		steps = slices.Insert(steps, k, explain.RuleStep{Where: where, Rule: "-A " + chain + " " + ret.spec, Verdict: "return"})
	}
	return steps, nil
}

// ipvsConn is a line of ipvsadm -Lnc: a connection IPVS made.
type ipvsConn struct {
	proto, state          string
	client, virtual, dest netip.AddrPort
}

// ipvsConns lists the node's IPVS connections (their templates, of
// persistence, have client port 0 and are left out).
func ipvsConns(e *env) ([]ipvsConn, error) {
	out, err := e.w.Exec(e.w.Node(), "ipvsadm", "-Lnc")
	if err != nil {
		return nil, fmt.Errorf("ipvsadm -Lnc: %v", err)
	}
	var conns []ipvsConn
	for _, line := range strings.Split(out, "\n") {
		// pro expire state source virtual destination
		f := strings.Fields(line)
		if len(f) < 6 {
			continue
		}
		c, s, v, d := ipvsConn{proto: f[0], state: f[2]}, f[3], f[4], f[5]
		var errs [3]error
		c.client, errs[0] = netip.ParseAddrPort(s)
		c.virtual, errs[1] = netip.ParseAddrPort(v)
		c.dest, errs[2] = netip.ParseAddrPort(d)
		if errs[0] != nil || errs[1] != nil || errs[2] != nil || c.client.Port() == 0 {
			continue
		}
		conns = append(conns, c)
	}
	return conns, nil
}

// ipvsStep is the virtual server's step for the flow from `from` to dst:
// the connection new in after, else a reject when the virtual server has
// no real server; ok false when IPVS has no virtual server there.
func ipvsStep(e *env, from netip.Addr, dst netip.AddrPort, proto string, before, after []ipvsConn) (explain.RuleStep, bool, error) {
	p := strings.ToUpper(proto)
	step := explain.RuleStep{Where: fmt.Sprintf("ipvs %s %s", p, dst)}
	for _, c := range after {
		if c.proto == p && c.client.Addr() == from && c.virtual == dst && !slices.Contains(before, c) {
			step.Rule, step.Verdict = fmt.Sprintf("connection %s %s -> %s -> %s", c.state, c.client, c.virtual, c.dest), "to "+c.dest.String()
			return step, true, nil
		}
	}
	flag := map[string]string{"TCP": "-t", "UDP": "-u", "SCTP": "--sctp-service"}[p]
	out, err := e.w.Exec(e.w.Node(), "ipvsadm", "-Ln", flag, dst.String())
	if err != nil {
		return step, false, nil // no virtual server: IPVS does not take the packet
	}
	if strings.Contains(out, "->") && strings.Count(out, "->") > 1 {
		return step, false, fmt.Errorf("IPVS made no connection from %s to %s though the virtual server has real servers:\n%s", from, dst, out)
	}
	step.Rule, step.Verdict = "no real server: "+lastLine(out), "reject"
	return step, true, nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(strings.Fields(lines[len(lines)-1]), " ")
}

// traceUserspace traces the redirect rules (traceNFT, or traceIPTables
// for the KP-USERSPACE- chains) and adds the listener's step when the
// flow was redirected: the listener is the reply source port of the
// flow's conntrack entry (a redirect rewrote its destination to it), and
// its verdict the endpoint of the connection onwards the listener opened
// (a conntrack entry new since the packet, from the node to no Service
// address).
func traceUserspace(e *env, from netip.Addr, dst netip.AddrPort, proto string, send func()) ([]explain.RuleStep, error) {
	inner := func(e *env, from netip.Addr, dst netip.AddrPort, proto string, send func()) ([]explain.RuleStep, error) {
		return traceNFTTables(e, from, dst, proto, send, userspace.TableName)
	}
	if e.mode.backend != "" {
		inner = traceIPTables
	}
	var before, after []ctEntry
	var readErr error
	steps, err := inner(e, from, dst, proto, func() {
		before, readErr = ctEntries(e, proto)
		send()
		time.Sleep(200 * time.Millisecond) // the listener's connection onwards
		if readErr == nil {
			after, readErr = ctEntries(e, proto)
		}
	})
	if err != nil {
		return nil, err
	}
	if readErr != nil {
		return nil, readErr
	}
	var flow *ctEntry
	for i, c := range after {
		if c.origSrc.Addr() == from && c.origDst == dst && !slices.Contains(before, c) && c.replySrc != dst {
			flow = &after[i]
		}
	}
	if flow == nil {
		return steps, nil // not redirected
	}
	// The kernel's verdict of a redirect is accept (iptables-legacy's
	// counters: none); the listener port is the entry's reply source.
	for i, s := range steps {
		if strings.Contains(s.Rule, "redirect") || strings.Contains(s.Rule, "REDIRECT") {
			steps[i].Verdict = fmt.Sprintf("redirect to :%d", flow.replySrc.Port())
		}
	}
	step := explain.RuleStep{Where: userspace.ListenerWhere(v1.Protocol(strings.ToUpper(proto)), int(flow.replySrc.Port())),
		Rule: "conntrack " + flow.String(), Verdict: "reject"}
	// The connection onwards follows the client's handshake, which a
	// tracer may have held back (iptables-legacy's counters drop the
	// flow's replies while they count): wait for it.
	deadline := time.Now().Add(slow(3 * time.Second))
	for {
		for _, c := range after {
			if c.origSrc.Addr() != from && c.origDst != dst && !slices.Contains(before, c) && !netns.ServiceCIDR.Contains(c.origDst.Addr()) {
				step.Verdict = "to " + c.origDst.String()
			}
		}
		if step.Verdict != "reject" || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
		if after, err = ctEntries(e, proto); err != nil {
			return nil, err
		}
	}
	return append(steps, step), nil
}

// ctEntry is a conntrack entry's tuples.
type ctEntry struct {
	origSrc, origDst, replySrc, replyDst netip.AddrPort
}

func (c ctEntry) String() string {
	return fmt.Sprintf("%s -> %s, reply %s -> %s", c.origSrc, c.origDst, c.replySrc, c.replyDst)
}

// ctEntries lists the node's conntrack entries of proto.
func ctEntries(e *env, proto string) ([]ctEntry, error) {
	out, err := e.w.Exec(e.w.Node(), "conntrack", "-L", "-p", proto)
	if err != nil && !strings.Contains(out, "flow entries have been shown") {
		return nil, fmt.Errorf("conntrack -L: %v", err)
	}
	var entries []ctEntry
	for _, line := range strings.Split(out, "\n") {
		var addrs, ports []string
		for _, f := range strings.Fields(line) {
			k, v, ok := strings.Cut(f, "=")
			switch {
			case !ok:
			case k == "src" || k == "dst":
				addrs = append(addrs, v)
			case k == "sport" || k == "dport":
				ports = append(ports, v)
			}
		}
		if len(addrs) < 4 || len(ports) < 4 {
			continue
		}
		var ap [4]netip.AddrPort
		good := true
		for i := range ap {
			a, err1 := netip.ParseAddr(addrs[i])
			p, err2 := strconv.ParseUint(ports[i], 10, 16)
			good = good && err1 == nil && err2 == nil
			ap[i] = netip.AddrPortFrom(a, uint16(p))
		}
		if good {
			entries = append(entries, ctEntry{ap[0], ap[1], ap[2], ap[3]})
		}
	}
	return entries, nil
}

func pathLines(steps []explain.RuleStep) string {
	var b strings.Builder
	for _, s := range steps {
		fmt.Fprintf(&b, "  %s: %s (%s)\n", s.Where, s.Verdict, s.Rule)
	}
	return b.String()
}

// kp explain's rule path of the ipvs mode (in the VM) and the userspace
// mode (both redirect methods) is the kernel's: for each case a real
// packet is traced through kp's rules, and the steps, their order and
// verdicts, and the virtual server's or listener's step, are what explain
// predicted.
func TestIPVSAndUserspaceRulePathIsTheKernelsTrace(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		var trace func(*env, netip.Addr, netip.AddrPort, string, func()) ([]explain.RuleStep, error)
		switch {
		case m.ipvs:
			trace = traceIPVS
		case m.userspace:
			trace = traceUserspace
		default:
			t.Skip("the other modes' rule paths are TestExplainedRulePathIsTheKernelsTrace's")
		}
		e := newEnv(t, m, 3)
		pods := e.w.Pods()
		svc := web(pods[:2]...)
		svc.Type = v1.ServiceTypeNodePort
		svc.Ports[0].NodePort = 30080
		empty := Service{Name: "empty", ClusterIPs: []string{"10.96.0.20"}, Ports: []Port{{Name: "http", Port: 80, TargetPort: 8080}}}
		e.write("web.yaml", svc, empty)
		e.startKP("--service-cidrs", netns.ServiceCIDR.String()+","+netns.ServiceCIDR6.String())
		e.answers(e.w.Client(), "tcp", webTCP)
		client, pod := e.w.ClientIP(), pods[2].IP
		nodePort := netip.AddrPortFrom(e.w.NodeIP(), 30080)
		for _, c := range []struct {
			name  string
			ns    string
			from  netip.Addr
			dst   netip.AddrPort
			proto string
		}{
			{"ClusterIP from outside the cluster", e.w.Client(), client, netip.MustParseAddrPort(webTCP), "tcp"},
			{"ClusterIP from a pod", pods[2].NS, pod, netip.MustParseAddrPort(webTCP), "tcp"},
			{"UDP ClusterIP", e.w.Client(), client, netip.MustParseAddrPort("10.96.0.10:53"), "udp"},
			{"NodePort", e.w.Client(), client, nodePort, "tcp"},
			{"no endpoints", e.w.Client(), client, netip.MustParseAddrPort("10.96.0.20:80"), "tcp"},
			{"a port the ClusterIP lacks", e.w.Client(), client, netip.MustParseAddrPort("10.96.0.10:81"), "tcp"},
			{"an unallocated ClusterIP", e.w.Client(), client, netip.MustParseAddrPort("10.96.0.99:80"), "tcp"},
		} {
			t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
				x := e.explainJSON("", c.from.String(), c.dst.String()+"/"+c.proto)
				if x.RulePath.Absent != "" && len(x.RulePath.Steps) == 0 {
					t.Fatalf("kp explain gives no rule path: %s", x.RulePath.Absent)
				}
				// send does not wait for the answer (the tracer contract):
				// the dial ends before the next case.
				dialed, sent := make(chan struct{}), false
				traced, err := trace(e, c.from, c.dst, c.proto, func() {
					sent = true
					go func() {
						defer close(dialed)
						e.w.Dial(c.ns, c.proto, c.dst.String(), slow(5*time.Second)) //nolint:errcheck // refused and dropped are cases
					}()
				})
				if sent {
					<-dialed
				}
				if err != nil {
					t.Fatal(err)
				}
				if len(traced) == 0 {
					t.Fatal("the kernel traced no rule of kp's")
				}
				t.Logf("traced:\n%s", pathLines(traced))
				if d := pathDiff(x.RulePath, traced); d != "" {
					t.Errorf("kp explain's rule path is not the kernel's:\n%s", d)
				}
			})
		}
	})
}
