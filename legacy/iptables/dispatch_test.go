package iptables

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
)

// packet is a new connection's first packet, for walking kp's chains.
type packet struct {
	dst   netip.Addr
	proto string
	port  int
}

// walk follows pkt through the restore input's chains from start, as the
// kernel would for the matches that decide the dispatch (-d with masks,
// -p, --dport ranges; any other match is taken to match, which can only
// lengthen the walk), and returns how many rules it evaluated and the
// per-service chain it reached ("" when none).
func walk(chains map[string][]string, start string, pkt packet) (int, string) {
	n := 0
	chain := start
	var stack []string
	pos := map[string]int{}
	for {
		rules := chains[chain]
		i := pos[chain]
		if i >= len(rules) {
			if len(stack) == 0 {
				return n, ""
			}
			chain, stack = stack[len(stack)-1], stack[:len(stack)-1]
			continue
		}
		pos[chain] = i + 1
		n++
		verb, target, ok := matches(rules[i], pkt)
		if !ok {
			continue
		}
		if !strings.HasPrefix(target, "KP-SVCS") && !strings.HasPrefix(target, "KP-NPS") && target != chainNodePorts {
			return n, target
		}
		if verb == "-j" {
			stack = append(stack, chain)
		}
		pos[target] = 0
		chain = target
	}
}

func matches(rule string, pkt packet) (verb, target string, ok bool) {
	f := strings.Fields(rule)
	ok = true
	for i := 0; i < len(f); i++ {
		switch f[i] {
		case "-d":
			a, m, _ := strings.Cut(f[i+1], "/")
			addr := netip.MustParseAddr(a)
			if m == "" {
				ok = ok && addr == pkt.dst
			} else if strings.Contains(m, ".") || strings.Contains(m, ":") {
				mask := addrKey(netip.MustParseAddr(m))
				ok = ok && addrKey(pkt.dst)&mask == addrKey(addr)
			}
		case "-p":
			ok = ok && f[i+1] == pkt.proto
		case "--dport":
			lo, hi, found := strings.Cut(f[i+1], ":")
			l, _ := strconv.Atoi(lo)
			h := l
			if found {
				h, _ = strconv.Atoi(hi)
			}
			ok = ok && pkt.port >= l && pkt.port <= h
		case "-j", "-g":
			verb, target = f[i], f[i+1]
		}
	}
	return verb, target, ok
}

// TestDispatchWalkAt10000Services renders 10,000 service ports (ClusterIPs
// spread over a /16 as the API server allocates them at random, each with
// a NodePort) and walks every one's first packet through nat KP-SERVICES
// and KP-NODEPORTS. Upstream's linear KUBE-SERVICES would evaluate up to
// 10,000 rules (and all of them for every flow to no Service); the tries
// keep every walk, hits and misses, within 64.
func TestDispatchWalkAt10000Services(t *testing.T) {
	b, fk, _ := fakeBackend(t, testConfig())
	w := newWorld()
	const n = 10000
	var ips []netip.Addr
	nodePorts := map[proxy.ServicePortName]int32{}
	for i := 0; i < n; i++ {
		// A pseudo-random, collision-free spread over 10.96.0.0/16.
		v := uint32(i)*40503%65536 + 1
		ip := netip.AddrFrom4([4]byte{10, 96, byte(v >> 8), byte(v)})
		name := statetest.PortName("ns", fmt.Sprintf("svc-%d", i), "", v1.ProtocolTCP)
		np := int32(20000 + i)
		if i%2 == 1 {
			name.Protocol = v1.ProtocolUDP
			np = int32(20000 + i - 1)
		}
		w.AddService(name, ip.String(), 80, np, "10.244.1.1:80")
		ips = append(ips, ip)
		nodePorts[name] = np
	}
	mustSync(t, b, w.Next())
	chains := map[string][]string{} // the nat table's
	table := ""
	for _, line := range strings.Split(string(fk.Inputs[0]), "\n") {
		if strings.HasPrefix(line, "*") {
			table = line[1:]
		}
		if rest, ok := strings.CutPrefix(line, "-A "); ok && table == "nat" {
			c, spec, _ := strings.Cut(rest, " ")
			chains[c] = append(chains[c], spec)
		}
	}
	worst, worstNP, total := 0, 0, 0
	for name, sp := range w.Services {
		proto := strings.ToLower(string(sp.Protocol))
		steps, got := walk(chains, chainServices, packet{sp.ClusterIPs[0], proto, 80})
		if got != svcChainName(sp) {
			t.Fatalf("%s: the walk to %s:80 ended at %q, want %s", name, sp.ClusterIPs[0], got, svcChainName(sp))
		}
		worst, total = max(worst, steps), total+steps
		steps, got = walk(chains, chainNodePorts, packet{netip.MustParseAddr("192.168.0.10"), proto, int(nodePorts[name])})
		if got != extChainName(sp) {
			t.Fatalf("%s: the walk to NodePort %d ended at %q", name, nodePorts[name], got)
		}
		worstNP = max(worstNP, steps)
	}
	miss, _ := walk(chains, chainServices, packet{netip.MustParseAddr("10.244.7.7"), "tcp", 443})
	t.Logf("ClusterIP walk: worst %d rules, mean %.1f; NodePort walk: worst %d; a flow to no Service: %d; %d chains",
		worst, float64(total)/n, worstNP, miss, len(chains))
	if worst > 64 || worstNP > 64 || miss > 64 {
		t.Errorf("walks too long: ClusterIP %d, NodePort %d, miss %d (bound 64)", worst, worstNP, miss)
	}

	// A partial sync that changes one service rewrites a handful of
	// chains, not the tries.
	one := statetest.PortName("ns", "svc-4242", "", v1.ProtocolTCP)
	w.SetEndpoints(one, "10.244.1.2:80")
	start := time.Now()
	mustSync(t, b, w.Next())
	t.Logf("a partial sync at %d service ports: %v to render, diff and apply to the fake (the fake's copy of the table: %v)",
		n, time.Since(start), fk.lastRestore)
	if got := strings.Count(string(fk.Inputs[1]), "\n:"); got > 8 {
		t.Errorf("a one-endpoint change declared %d chains:\n%s", got, fk.Inputs[1])
	}
	// Adding a service touches only its path.
	w.AddService(statetest.PortName("ns", "new", "", v1.ProtocolTCP), "10.96.250.250", 80, 0, "10.244.1.1:80")
	mustSync(t, b, w.Next())
	if got := strings.Count(string(fk.Inputs[2]), "\n:"); got > 16 {
		t.Errorf("adding one service declared %d chains:\n%s", got, fk.Inputs[2])
	}
	_ = context.Background
}
