package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/test/netns"
)

// Can a switch drop a SYN to a NodePort, between the old mode's removal
// and the new mode's NodePort rules? A switch programs the new mode in
// full (one transaction per table) while the old one serves, and removes
// the old one only after; so at every instant one mode's NodePort rule is
// in the kernel. The kernel says so: the nat chains of a hook are
// consulted in priority order only until one NATs the connection's first
// packet, so a nat chain of another table just after kp's (-99; kp's
// modes are at -100) counts exactly the new connections to the NodePort
// that met no NodePort rule of any mode. Under loops of new connections
// from the off-node client through switches between every mode of the
// host, nftables → iptables-nft (the old mode's chains first in the
// hooks: removed before the new mode is proven) → nftables →
// iptables-legacy → nftables → userspace → nftables, that count stays 0;
// a control port kp does not serve shows the chain counts.
func TestMigrateNodeNoNodePortConnectionMeetsNoRuleDuringSwitches(t *testing.T) {
	netns.Require(t, "nft", "iptables-nft-save", "iptables-legacy-save", "ip6tables-nft-save", "ip6tables-legacy-save")
	e := newEnv(t, modeNFTables, 3)
	pods := e.w.Pods()
	svc := web(pods...)
	svc.Type = v1.ServiceTypeNodePort
	svc.Ports[0].NodePort, svc.Ports[1].NodePort = 30080, 30053
	e.write("web.yaml", svc)
	// iptables-nft's nat chains older than kp's table, as kubelet's are on
	// a real node (see migrations' olderNAT).
	for _, chain := range []string{"PREROUTING", "OUTPUT"} {
		if out, err := e.w.Exec(e.w.Node(), "iptables-nft", "-t", "nat", "-A", chain, "-d", "192.0.2.1/32", "-j", "RETURN"); err != nil {
			t.Fatalf("an older iptables-nft nat chain: %v\n%s", err, out)
		}
	}
	e.startKP()
	client := e.w.Client()
	nodeTCP := hostPort(e.w.NodeIP().String(), 30080)
	e.answers(client, "tcp", nodeTCP)
	// The client's SYNs to the NodePort, counted as they come in (before
	// conntrack), and as they leave the filter hooks towards a pod
	// (forward) or the userspace proxy's listener (input); the nat chain
	// after kp's counts the connections that met no rule.
	e.nftScript(fmt.Sprintf(`table ip kp-e2e-measure {
	chain syn-in { type filter hook prerouting priority -300; ip saddr %[2]s ip daddr %[1]s tcp dport 30080 tcp flags & (syn | ack) == syn counter; }
	chain missed { type nat hook prerouting priority -99; ip daddr %[1]s tcp dport 30080 counter; }
	chain control { type nat hook prerouting priority -99; ip daddr %[1]s tcp dport 30099 counter; }
	chain syn-forwarded { type filter hook forward priority 1000; tcp flags & (syn | ack) == syn ct original ip saddr %[2]s ct original proto-dst 30080 counter; }
	chain syn-delivered { type filter hook input priority 1000; tcp flags & (syn | ack) == syn ct original ip saddr %[2]s ct original proto-dst 30080 counter; }
}`, e.w.NodeIP(), e.w.ClientIP()))
	// Two loops of new connections, back to back: on this machine about a
	// thousand a second, through every step of each switch.
	var loops []*netns.Loop
	for range 2 {
		loops = append(loops, netns.StartLoop(netns.LoopSpec{
			Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return netns.DialConn(ctx, client, network, addr)
			},
			Addrs:   []string{nodeTCP},
			Timeout: slow(3 * time.Second),
			Slow:    slow(netns.SlowConnect),
		}))
	}
	// KP_E2E_SYN_CONTROL=1 runs the same loops without switches, for the
	// comparison in test/proofs/t32a.md.
	control := os.Getenv("KP_E2E_SYN_CONTROL") == "1"
	for _, target := range []string{"iptables-nft", "nftables", "iptables-legacy", "nftables", "userspace", "nftables"} {
		time.Sleep(300 * time.Millisecond)
		if control {
			time.Sleep(3 * time.Second)
			continue
		}
		out := e.migrate("--to", target)
		t.Logf("kp migrate node --to %s:\n%s", target, tail(out, 8))
	}
	time.Sleep(300 * time.Millisecond)
	var attempts, resent, slowOnly int
	var errs []string
	for _, l := range loops {
		sum := l.Stop()
		t.Logf("loop: %s", sum)
		for _, a := range sum.Attempts {
			attempts++
			switch {
			case a.Err != nil:
				errs = append(errs, a.Failure(sum.Bound))
			case a.SYNRetransmits > 0:
				resent++
			case a.Latency() > sum.Bound:
				slowOnly++
			}
		}
	}
	synIn, missed := e.measured("syn-in"), e.measured("missed")
	synOut := e.measured("syn-forwarded") + e.measured("syn-delivered")
	paws := 0
	for _, p := range pods {
		paws += e.nstat(p.NS, "TcpExtPAWSTimewait")
	}
	t.Logf("%d attempts: %d with a SYN sent again, %d slow without one, %d failed; the node: %d SYNs to the NodePort in, "+
		"%d forwarded or delivered, %d new connections met no NodePort rule; the endpoints refused %d SYNs for a connection "+
		"of the same addresses and ports in TIME_WAIT (TcpExtPAWSTimewait)", attempts, resent, slowOnly, len(errs), synIn, synOut, missed, paws)
	if missed != 0 {
		t.Errorf("%d new connections to the NodePort met no NodePort rule of any mode during the switches", missed)
	}
	if synOut != synIn {
		t.Errorf("%d SYNs to the NodePort came in, %d went on to a pod or a listener: the node dropped %d", synIn, synOut, synIn-synOut)
	}
	// Loops this fast reuse the client's ports within the endpoints'
	// TIME_WAIT, and masquerade keeps the port: an endpoint sees a SYN of
	// the connection it just closed, refuses it (PAWS), and the client
	// sends it again, with or without switches (test/proofs/t32a.md).
	// Every SYN sent again must be one of those.
	if resent > paws {
		t.Errorf("%d attempts sent their SYN again; the endpoints refused only %d SYNs of reused ports", resent, paws)
	}
	if len(errs) > 0 {
		t.Errorf("%d attempts failed:\n%s", len(errs), strings.Join(errs, "\n"))
	}
	// The control: a nat chain after kp's counts a connection no rule
	// serves.
	if _, err := e.ask(client, "tcp", hostPort(e.w.NodeIP().String(), 30099)); err == nil {
		t.Error("port 30099 answered, but no Service has it")
	}
	if n := e.measured("control"); n == 0 {
		t.Error("a connection to a port no rule serves was not counted by a nat chain after kp's: the measurement proves nothing")
	}
}

// nstat reads one of the kernel's network counters in namespace ns.
func (e *env) nstat(ns, name string) int {
	e.t.Helper()
	out, err := e.w.Exec(ns, "nstat", "-az", name)
	if err != nil {
		e.t.Fatalf("nstat in %s: %v\n%s", ns, err, out)
	}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == name {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	return 0
}
