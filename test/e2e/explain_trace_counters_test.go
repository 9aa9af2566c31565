package e2e

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kpproxy/kp/explain"
)

// The counter tracer of iptables-legacy (traceIPTables uses it where the
// kernel's TRACE cannot reach a test namespace).

// traceCounters is iptables-legacy's record: the rules' packet counters.
// Why not TRACE: iptables-legacy's TRACE logs through nf_log, which a
// network namespace other than the initial one gets only with the global
// sysctl net.netfilter.nf_log_all_netns=1, a setting of the root
// namespace the tests may not touch. So: zero the counters of the node's
// nat and filter tables (the namespace is the test's), keep the flow's
// replies from counting (a mangle rule of the test's drops the flow's
// reply direction while the trace runs: a reply would move KP-FORWARD's
// ESTABLISHED rule and the jumps without a state match), send the one
// packet, and read iptables-legacy-save -c: the rules that counted it,
// walked in evaluation order (the hooks in the order a packet meets them,
// each built-in chain's jumps into kp's chains, each chain's rules in
// order, into every chain a counted rule jumps to).
func traceCounters(e *env, from netip.Addr, dst netip.AddrPort, proto string, send func(), bin string) ([]explain.RuleStep, error) {
	// The flow's packets other than its first: its replies and what
	// the node answers for it (a REJECT's reset or ICMP error, whose
	// protocol is not the flow's but whose connection is).
	replies := []string{"-m", "conntrack", "--ctdir", "REPLY", "--ctproto", proto, "--ctorigsrc", from.String(),
		"--ctorigdst", dst.Addr().String(), "--ctorigdstport", strconv.Itoa(int(dst.Port())),
		"-m", "comment", "--comment", "kp e2e trace", "-j", "DROP"}
	// And, for the record a failed case prints (KF-14), rules of the
	// test's that count the flow's first packet in every hook it can
	// meet, whatever kp's rules do with it.
	first := flowMatch(from, dst, proto)
	count := append(slices.Clip(first[:len(first)-4]), "-m", "comment", "--comment", "kp e2e count")
	undo, err := testRules(e, bin, map[[2]string][]string{{"mangle", "PREROUTING"}: replies, {"mangle", "OUTPUT"}: replies,
		{"raw", "PREROUTING"}: count, {"mangle", "FORWARD"}: count, {"mangle", "INPUT"}: count, {"mangle", "POSTROUTING"}: count,
		{"filter", "FORWARD"}: count, {"filter", "INPUT"}: count})
	if err != nil {
		return nil, fmt.Errorf("hold the replies back: %w", err)
	}
	defer undo()
	for _, t := range []string{"nat", "filter"} {
		if out, err := e.w.Exec(e.w.Node(), bin, "-t", t, "-Z"); err != nil {
			return nil, fmt.Errorf("zero the %s counters: %w\n%s", t, err, out)
		}
	}
	send()
	time.Sleep(300 * time.Millisecond)
	// Read until two reads agree: once, on a loaded machine, the nat
	// table's counters had the packet and the filter table's, read after
	// them, not yet.
	var saved, last map[string]map[string][]countedRule
	for try := 0; try < 10 && (saved == nil || !reflect.DeepEqual(saved, last)); try++ {
		if saved != nil {
			time.Sleep(200 * time.Millisecond)
		}
		last, saved = saved, map[string]map[string][]countedRule{}
		for _, t := range []string{"nat", "filter"} {
			out, err := e.w.Exec(e.w.Node(), bin+"-save", "-c", "-t", t)
			if err != nil {
				return nil, fmt.Errorf("%s-save: %w\n%s", bin, err, out)
			}
			saved[t] = parseCounted(out)
		}
	}
	local, err := nodeAddrs(e)
	if err != nil {
		return nil, err
	}
	isLocal := func(a netip.Addr) bool { return a.IsLoopback() || slices.Contains(local, a) }
	e.traceRecord = counterRecord(e, bin, dst)
	return walkCounted(saved, counterPath{fromNode: isLocal(from), dst: dst.Addr(), local: isLocal}), nil
}

// counterRecord is what a failed case prints about the node after its
// trace (KF-14): the counted rules of every chain (built-in ones too, with
// their policy counters), the flow's conntrack entries and the kernel's
// drop counters that moved.
func counterRecord(e *env, bin string, dst netip.AddrPort) string {
	var b strings.Builder
	for _, t := range []string{"nat", "filter", "mangle", "raw"} {
		out, _ := e.w.Exec(e.w.Node(), bin+"-save", "-c", "-t", t)
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "*") || (strings.HasPrefix(line, "[") || strings.HasPrefix(line, ":")) && !strings.Contains(line, "[0:0]") {
				fmt.Fprintf(&b, "  %s\n", line)
			}
		}
	}
	out, _ := e.w.Exec(e.w.Node(), "conntrack", "-L", "-d", dst.Addr().String())
	fmt.Fprintf(&b, "  conntrack -L -d %s:\n%s\n", dst.Addr(), out)
	out, _ = e.w.Exec(e.w.Node(), "nstat", "-a")
	fmt.Fprintf(&b, "  nstat -a:\n%s\n", out)
	out, _ = e.w.Exec(e.w.Node(), "sysctl", "net.ipv4.ip_forward", "net.ipv4.conf.all.rp_filter")
	fmt.Fprintf(&b, "  %s\n", out)
	return b.String()
}

// nodeAddrs are the node namespace's addresses.
func nodeAddrs(e *env) ([]netip.Addr, error) {
	out, err := e.w.Exec(e.w.Node(), "ip", "-o", "addr", "show")
	if err != nil {
		return nil, fmt.Errorf("the node's addresses: %w", err)
	}
	var as []netip.Addr
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "inet" || f[i] == "inet6" {
				if p, err := netip.ParsePrefix(f[i+1]); err == nil {
					as = append(as, p.Addr())
				}
			}
		}
	}
	return as, nil
}

// countedRule is one rule of iptables-save -c.
type countedRule struct {
	packets uint64
	spec    string // after "-A CHAIN "
}

func parseCounted(save string) map[string][]countedRule {
	out := map[string][]countedRule{}
	for _, line := range strings.Split(save, "\n") {
		if !strings.HasPrefix(line, "[") {
			continue
		}
		end := strings.IndexByte(line, ']')
		pk, _, _ := strings.Cut(line[1:end], ":")
		n, _ := strconv.ParseUint(pk, 10, 64)
		rest, ok := strings.CutPrefix(strings.TrimSpace(line[end+1:]), "-A ")
		if !ok {
			continue
		}
		chain, spec, _ := strings.Cut(rest, " ")
		out[chain] = append(out[chain], countedRule{packets: n, spec: spec})
	}
	return out
}

// counterPath is where the counted packet went, which tells the hooks it
// met (the kernel's hook graph): a packet of the node's own meets nat
// OUTPUT, filter OUTPUT and nat POSTROUTING, then filter INPUT when it
// goes to the node's own address (through lo); a packet that arrives meets
// nat PREROUTING, then filter INPUT when its destination (after DNAT) is
// the node's, else filter FORWARD and nat POSTROUTING. Another packet's
// counts in a hook this one did not meet (an IPv6 neighbour solicitation
// through filter INPUT's jumps, which match every packet) are not read.
type counterPath struct {
	fromNode bool
	dst      netip.Addr
	local    func(netip.Addr) bool
}

// walkCounted orders the counted rules as the kernel evaluated them.
func walkCounted(saved map[string]map[string][]countedRule, cp counterPath) []explain.RuleStep {
	var steps []explain.RuleStep
	var call func(table, chain string) string
	// call walks chain's counted rules; it returns "" (fell through or
	// returned), "accept" (the hook is done) or "stop".
	call = func(table, chain string) string {
		for _, r := range saved[table][chain] {
			if r.packets == 0 || !firstPacketCan(r.spec) {
				continue
			}
			tgt, goTo := specTarget(r.spec)
			builtin := !strings.HasPrefix(chain, "KP-")
			if builtin && !strings.HasPrefix(tgt, "KP-") {
				continue // not kp's
			}
			st := explain.RuleStep{Where: table + " " + chain, Rule: "-A " + chain + " " + r.spec}
			switch v := terminalVerdict(r.spec); {
			case strings.HasPrefix(tgt, "KP-"):
				st.Verdict = "jump " + tgt
				if goTo {
					st.Verdict = "goto " + tgt
				}
				steps = append(steps, st)
				if out := call(table, tgt); out != "" {
					return out
				}
				if goTo {
					return ""
				}
			case v == "return":
				st.Verdict = v
				steps = append(steps, st)
				return ""
			case v == "drop" || v == "reject":
				st.Verdict = v
				steps = append(steps, st)
				return "stop"
			case v != "":
				st.Verdict = v
				steps = append(steps, st)
				return "accept"
			default:
				st.Verdict = "continue"
				steps = append(steps, st)
			}
		}
		return ""
	}
	dst := cp.dst
	redirected := false // a REDIRECT (the userspace mode's): to the node itself
	hook := func(table, chain string) bool {
		out := call(table, chain)
		for _, st := range steps {
			redirected = redirected || strings.HasPrefix(st.Verdict, "redirect")
			if to, ok := strings.CutPrefix(st.Verdict, "dnat to "); ok {
				if ap, err := netip.ParseAddrPort(to); err == nil {
					dst = ap.Addr()
				} else if a, err := netip.ParseAddr(to); err == nil {
					dst = a
				}
			}
		}
		return out != "stop"
	}
	switch {
	case cp.fromNode:
		if hook("nat", "OUTPUT") && hook("filter", "OUTPUT") && hook("nat", "POSTROUTING") && (cp.local(dst) || redirected) {
			hook("filter", "INPUT")
		}
	case !hook("nat", "PREROUTING"):
	case cp.local(dst) || redirected:
		hook("filter", "INPUT")
	case hook("filter", "FORWARD"):
		hook("nat", "POSTROUTING")
	}
	return steps
}

// firstPacketCan reports whether a connection's first packet can match
// spec: not when spec asks for a state only later packets have
// (ESTABLISHED, RELATED, INVALID). Such a rule's counter moved for
// another packet of the flow, one the mangle rules could not hold back
// (an ICMP error a router sends back about it, say).
func firstPacketCan(spec string) bool {
	f := strings.Fields(spec)
	for i := 0; i+1 < len(f); i++ {
		if f[i] != "--ctstate" || i > 0 && f[i-1] == "!" {
			continue
		}
		states := strings.Split(f[i+1], ",")
		if !slices.Contains(states, "NEW") && !slices.Contains(states, "DNAT") && !slices.Contains(states, "SNAT") {
			return false
		}
	}
	return true
}

// specTarget is the rule's -j or -g target.
func specTarget(spec string) (string, bool) {
	f := strings.Fields(spec)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "-j" || f[i] == "-g" {
			return f[i+1], f[i] == "-g"
		}
	}
	return "", false
}
