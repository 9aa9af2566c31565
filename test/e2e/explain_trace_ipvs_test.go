package e2e

import (
	"bufio"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/explain"
	"github.com/kpproxy/kp/legacy/userspace"
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
	if slices.ContainsFunc(steps, func(s explain.RuleStep) bool { return s.Verdict == "drop" || s.Verdict == "reject" }) {
		return steps, nil // the packet ended in kp's chains, before IPVS
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
	// The listener's connection onwards is to one of the Service port's
	// endpoints, chosen or not: the model's list (kp explain's) keeps
	// other connections of the node's out of the trace, and leaves a
	// wrong choice among the port's endpoints to show.
	endpoints := map[netip.AddrPort]bool{}
	for _, ep := range e.explainJSON("", from.String(), dst.String()+"/"+proto).Endpoints {
		if ap, err := netip.ParseAddrPort(ep.Address); err == nil {
			endpoints[ap] = true
		}
	}
	// The kernel's conntrack events, not its dumps: a dump taken while
	// entries come and go can miss some, which a before-and-after
	// comparison then takes for new ones (another connection's).
	events, err := watchNewFlows(e, proto)
	if err != nil {
		return nil, err
	}
	defer events.stop()
	var flow *ctEntry
	var onward []ctEntry
	// redirected finds the client's entry once the kernel made it (its
	// reply comes from a listener, not from dst), and the connections
	// made after it to one of the port's endpoints.
	redirected := func() {
		flow, onward = nil, nil
		for _, c := range events.seen() {
			switch {
			case flow == nil && c.origSrc.Addr() == from && c.origDst == dst && c.replySrc != dst:
				flow = &c
			case flow != nil && c.origSrc.Addr() != from && endpoints[c.origDst]:
				onward = append(onward, c)
			}
		}
	}
	steps, err := inner(e, from, dst, proto, func() {
		send()
		// send does not wait for the packet: wait for its entry (on a
		// loaded machine the client may start late), so that the trace
		// holds it.
		for deadline := time.Now().Add(slow(3 * time.Second)); flow == nil && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
			redirected()
		}
	})
	if err != nil {
		return nil, err
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
	for deadline := time.Now().Add(slow(3 * time.Second)); len(onward) == 0 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		redirected()
	}
	switch len(onward) {
	case 0:
	case 1:
		step.Verdict = "to " + onward[0].origDst.String()
	default:
		return nil, fmt.Errorf("%d connections onwards to the endpoints after %s: %v", len(onward), flow, onward)
	}
	return append(steps, step), nil
}

// flowWatch reads the node's conntrack NEW events (conntrack -E).
type flowWatch struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	new  []ctEntry
	done chan struct{}
}

// watchNewFlows starts reading the node's new conntrack entries of
// proto; it returns once conntrack listens.
func watchNewFlows(e *env, proto string) (*flowWatch, error) {
	w := &flowWatch{done: make(chan struct{})}
	w.cmd = exec.Command("ip", "netns", "exec", e.w.Node(), "conntrack", "-E", "-e", "NEW", "-p", proto)
	out, err := w.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := w.cmd.Start(); err != nil {
		return nil, fmt.Errorf("conntrack -E: %w", err)
	}
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if c, ok := parseCTLine(sc.Text()); ok {
				w.mu.Lock()
				w.new = append(w.new, c)
				w.mu.Unlock()
			}
		}
	}()
	// conntrack subscribes at once but prints nothing until an event:
	// give it a moment before the packet, as the other tracers do.
	time.Sleep(300 * time.Millisecond)
	return w, nil
}

func (w *flowWatch) seen() []ctEntry {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.new)
}

func (w *flowWatch) stop() {
	_ = w.cmd.Process.Kill()
	_ = w.cmd.Wait()
	<-w.done
}

// ctEntry is a conntrack entry's tuples.
type ctEntry struct {
	origSrc, origDst, replySrc, replyDst netip.AddrPort
}

func (c ctEntry) String() string {
	return fmt.Sprintf("%s -> %s, reply %s -> %s", c.origSrc, c.origDst, c.replySrc, c.replyDst)
}

// parseCTLine reads a conntrack -L or -E line's tuples.
func parseCTLine(line string) (ctEntry, bool) {
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
		return ctEntry{}, false
	}
	var ap [4]netip.AddrPort
	for i := range ap {
		a, err1 := netip.ParseAddr(addrs[i])
		p, err2 := strconv.ParseUint(ports[i], 10, 16)
		if err1 != nil || err2 != nil {
			return ctEntry{}, false
		}
		ap[i] = netip.AddrPortFrom(a, uint16(p))
	}
	return ctEntry{ap[0], ap[1], ap[2], ap[3]}, true
}

func pathLines(steps []explain.RuleStep) string {
	var b strings.Builder
	for _, s := range steps {
		fmt.Fprintf(&b, "  %s: %s (%s)\n", s.Where, s.Verdict, s.Rule)
	}
	return b.String()
}
