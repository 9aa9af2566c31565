package userspace

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/conntrack"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/test/netns"
)

func TestKernelListenersRefuseConnectionsKPDidNotRedirect(t *testing.T) {
	forEachRedirect(t, testListenersRefuseWhatKPDidNotRedirect)
}

// A client connecting straight to a listener's port on the node's address
// is refused at once, in both families, whoever it is; through the
// Service's addresses the same listeners answer. Cleanup removes the
// refusal with the rest.
func testListenersRefuseWhatKPDidNotRedirect(t *testing.T, red redirectMethod) {
	k := newKernelWorldWith(t, 1, red, proxy.Config{})
	p0 := k.w.Pods()[0]
	web := k.add("web", v1.ProtocolTCP, "10.96.0.10", 80, 30080, p0.IP.String()+":8080", netip.AddrPortFrom(p0.IP6, 8080).String())
	k.st.Services[web].ClusterIPs = append(k.st.Services[web].ClusterIPs, netip.MustParseAddr("fd00:96::10"))
	k.add("dns", v1.ProtocolUDP, "10.96.0.12", 53, 0, p0.IP.String()+":5353")
	k.sync()
	for _, c := range []struct{ network, addr string }{
		{"tcp", "10.96.0.10:80"}, {"tcp", "[fd00:96::10]:80"}, {"tcp", k.w.NodeIP().String() + ":30080"}, {"udp", "10.96.0.12:53"},
	} {
		if name, err := k.ask(k.w.Client(), c.network, c.addr); err != nil || name != "pod-0" {
			t.Errorf("%s %s through the redirect: %q %v", c.network, c.addr, name, err)
		}
	}
	var ports []string
	for key, p := range k.b.proxies {
		network := strings.ToLower(string(p.protocol()))
		ports = append(ports, network+" "+strconv.Itoa(p.port()))
		for _, from := range []string{k.w.Client(), k.w.Node()} {
			for _, a := range []netip.Addr{k.w.NodeIP(), k.w.NodeIP6()} {
				addr := netip.AddrPortFrom(a, uint16(p.port())).String()
				start := time.Now()
				reply, err := k.ask(from, network, addr)
				if !errors.Is(err, syscall.ECONNREFUSED) || time.Since(start) > time.Second {
					t.Errorf("%s's listener (%s), straight from %s to %s: want refused at once, got %q %v after %v",
						key.name, network, from, addr, reply, err, time.Since(start))
				}
			}
		}
	}
	if len(ports) != 3 {
		t.Errorf("listeners %v, want web's two (ClusterIP, NodePort) and dns's", ports)
	}
	for _, fam := range []string{"ip", "ip6"} {
		rules, err := k.rules(fam)
		if err != nil || !strings.Contains(rules, "listeners") && !strings.Contains(rules, "LISTENERS") {
			t.Errorf("the %s %s rules hold no listener refusal: %v\n%s", red.name, fam, err, rules)
		}
	}
	if err := k.b.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, fam := range []string{"ip", "ip6"} {
		if rules, _ := k.rules(fam); strings.Contains(rules, "LISTENERS") || strings.Contains(rules, "listeners") {
			t.Errorf("after Cleanup, %s:\n%s", fam, rules)
		}
	}
}

func TestKernelListenersRefuseDirectConnectionsWithoutTheFilter(t *testing.T) {
	forEachRedirect(t, testListenersRefuseDirectWithoutFilter)
}

// With the rules' listener filter gone (as while an old userspace proxy
// drains after a switch, or before a new listener's port is written), the
// proxy itself resets a TCP connection straight to a listener's port:
// conntrack says nothing redirected it. One through the ClusterIP still
// answers. After Cleanup, with another mode's rules keeping conntrack and
// NAT on as a switch leaves them, the same holds.
func testListenersRefuseDirectWithoutFilter(t *testing.T, red redirectMethod) {
	k := newKernelWorldWith(t, 1, red, proxy.Config{})
	p0 := k.w.Pods()[0]
	web := k.add("web", v1.ProtocolTCP, "10.96.0.10", 80, 0, p0.IP.String()+":8080", netip.AddrPortFrom(p0.IP6, 8080).String())
	k.st.Services[web].ClusterIPs = append(k.st.Services[web].ClusterIPs, netip.MustParseAddr("fd00:96::10"))
	k.sync()
	ln := k.b.proxies[proxyKey{name: web}]
	removeListenerFilter(t, k)
	refused := 0
	direct := func(when string) {
		t.Helper()
		for _, a := range []netip.Addr{k.w.NodeIP(), k.w.NodeIP6()} {
			addr := netip.AddrPortFrom(a, uint16(ln.port())).String()
			reply, err := k.ask(k.w.Client(), "tcp", addr)
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("%s, straight to the listener at %s: %q %v, want a reset", when, addr, reply, err)
			}
			refused++
		}
	}
	direct("without the filter")
	for _, addr := range []string{"10.96.0.10:80", "[fd00:96::10]:80"} {
		if name, err := k.ask(k.w.Client(), "tcp", addr); err != nil || name != "pod-0" {
			t.Errorf("through the ClusterIP %s without the filter: %q %v", addr, name, err)
		}
	}
	standInMode(t, k)
	if err := k.b.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	direct("after Cleanup")
	if got := testutil.ToFloat64(k.b.stats.direct.WithLabelValues("TCP")); got != float64(refused) {
		t.Errorf("kp_userspace_direct_connections_refused_total{protocol=TCP} = %v, want %d", got, refused)
	}
}

func TestKernelUDPListenersOpenNoNewSessionAfterCleanup(t *testing.T) {
	forEachRedirect(t, testUDPNoNewSessionAfterCleanup)
}

// After Cleanup (a switch away: the rules are gone, the listeners drain),
// a datagram from a new client straight to a UDP listener gets no answer,
// while a client whose session is open is still answered (by the proxy
// while its conntrack entry redirects it, by the next mode once the drain
// handed it over).
func testUDPNoNewSessionAfterCleanup(t *testing.T, red redirectMethod) {
	k := newKernelWorldWith(t, 1, red, proxy.Config{UserspaceUDPIdleTimeout: 30 * time.Second})
	p0 := k.w.Pods()[0]
	dns := k.add("dns", v1.ProtocolUDP, "10.96.0.12", 53, 0, p0.IP.String()+":5353")
	k.sync()
	ln := k.b.proxies[proxyKey{name: dns}]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	open, err := netns.DialConn(ctx, k.w.Client(), "udp", "10.96.0.12:53")
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	askOpen := func(when string) {
		t.Helper()
		actx, acancel := context.WithTimeout(ctx, 2*time.Second)
		defer acancel()
		if reply, err := netns.Ask(actx, open); err != nil || !strings.HasPrefix(reply, "pod-0 ") {
			t.Errorf("the open session, %s: %q %v", when, reply, err)
		}
	}
	askOpen("before Cleanup")
	standInMode(t, k)
	// The stand-in mode serves the Service, for the open flow once the
	// drain hands it over (handover.go: at once when it is quiet).
	rule := []string{"add", "rule", "inet", "standin", "prerouting", "ip", "daddr", "10.96.0.12", "udp", "dport", "53", "dnat", "ip", "to", p0.IP.String() + ":5353"}
	if out, err := k.w.NFT(rule...); err != nil {
		t.Fatalf("nft %v: %v\n%s", rule, err, out)
	}
	if err := k.b.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	addr := netip.AddrPortFrom(k.w.NodeIP(), uint16(ln.port())).String()
	if reply, err := k.ask(k.w.Client(), "udp", addr); err == nil {
		t.Errorf("a new client straight to the UDP listener at %s after Cleanup: answered %q, want nothing", addr, reply)
	}
	askOpen("after Cleanup")
	if got := testutil.ToFloat64(k.b.stats.direct.WithLabelValues("UDP")); got != 1 {
		t.Errorf("kp_userspace_direct_connections_refused_total{protocol=UDP} = %v, want 1", got)
	}
}

// removeListenerFilter deletes the listener refusal from k's rules, leaving
// the redirects.
func removeListenerFilter(t *testing.T, k *kernelWorld) {
	t.Helper()
	for _, fam := range []string{"ip", "ip6"} {
		var out string
		var err error
		if k.red.iptablesBackend == "" {
			out, err = k.w.NFT("flush", "chain", fam, TableName, "filter-input")
		} else {
			bin := "iptables-" + k.red.iptablesBackend
			if fam == "ip6" {
				bin = "ip6" + bin[2:]
			}
			out, err = k.w.Exec(k.w.Node(), bin, "-t", "filter", "-F", chainListeners)
		}
		if err != nil {
			t.Fatalf("remove the %s listener filter: %v\n%s", fam, err, out)
		}
		left := `"listeners: only what kp redirected"` // filter-input's rule
		if k.red.iptablesBackend != "" {
			left = "-A " + chainListeners + " "
		}
		if rules, _ := k.rules(fam); strings.Contains(rules, left) {
			t.Fatalf("the %s listener filter is still there:\n%s", fam, rules)
		}
	}
}

// standInMode writes, in the node namespace, rules that keep conntrack and
// NAT on after Cleanup removes kp's, as the mode a switch goes to does
// (without them the kernel stops tracking, and existing redirects stop
// being translated, when the last rule needing them goes).
func standInMode(t *testing.T, k *kernelWorld) {
	t.Helper()
	for _, args := range [][]string{
		{"add", "table", "inet", "standin"},
		{"add", "chain", "inet", "standin", "prerouting", "{ type nat hook prerouting priority -100; }"},
		{"add", "chain", "inet", "standin", "output", "{ type nat hook output priority -100; }"},
		{"add", "chain", "inet", "standin", "input", "{ type filter hook input priority 0; }"},
		{"add", "rule", "inet", "standin", "input", "ct", "state", "established", "counter"},
	} {
		if out, err := k.w.NFT(args...); err != nil {
			t.Fatalf("nft %v: %v\n%s", args, err, out)
		}
	}
}

// A datagram of a UDP flow that the drain handed over, which was redirected
// before its conntrack entry went and so reached the listener after, is
// sent on through the next mode from the client's own address: the client
// gets its answer from the Service address (handover.go, reinject). The
// flow is handed over by hand here, and its late datagram sent straight to
// the listener from the client's port.
func TestKernelUDPLateDatagramOfAHandedOverFlowIsAnsweredThroughTheNextMode(t *testing.T) {
	k := newKernelWorldWith(t, 1, redirectMethods[0], proxy.Config{})
	p0 := k.w.Pods()[0]
	dns := k.add("dns", v1.ProtocolUDP, "10.96.0.12", 53, 0, p0.IP.String()+":5353")
	k.sync()
	ln := k.b.proxies[proxyKey{name: dns}]
	standInMode(t, k)
	for _, chain := range []string{"prerouting", "output"} {
		rule := []string{"add", "rule", "inet", "standin", chain, "ip", "daddr", "10.96.0.12", "udp", "dport", "53", "dnat", "ip", "to", p0.IP.String() + ":5353"}
		if out, err := k.w.NFT(rule...); err != nil {
			t.Fatalf("nft %v: %v\n%s", rule, err, out)
		}
	}
	if err := k.b.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	var pc net.PacketConn
	if err := netns.InNamespace(k.w.Client(), func() (err error) { pc, err = net.ListenPacket("udp4", ":0"); return err }); err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	client := netip.AddrPortFrom(k.w.ClientIP(), uint16(pc.LocalAddr().(*net.UDPAddr).Port))
	listener := netip.AddrPortFrom(k.w.NodeIP(), uint16(ln.port()))
	h := k.b.handover.Load()
	h.mu.Lock()
	h.done[flowKey{client, listener.Port()}] = conntrack.Flow{Protocol: conntrack.ProtoUDP,
		Orig:  conntrack.Tuple{Src: client, Dst: netip.MustParseAddrPort("10.96.0.12:53")},
		Reply: conntrack.Tuple{Src: listener, Dst: client}}
	h.mu.Unlock()
	if _, err := pc.WriteTo([]byte("?\n"), net.UDPAddrFromAddrPort(listener)); err != nil {
		t.Fatal(err)
	}
	_ = pc.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 512)
	n, from, err := pc.ReadFrom(buf)
	if err != nil {
		t.Fatalf("the late datagram from %s got no answer: %v", client, err)
	}
	if got := from.(*net.UDPAddr).AddrPort(); got.String() != "10.96.0.12:53" || !strings.HasPrefix(string(buf[:n]), "pod-0 ") {
		t.Errorf("the late datagram was answered %q from %s, want pod-0 from the Service address 10.96.0.12:53", buf[:n], got)
	}
	// The proxy counts after its send returned, maybe after the answer.
	for deadline := time.Now().Add(time.Second); ; time.Sleep(10 * time.Millisecond) {
		got := testutil.ToFloat64(k.b.stats.handover.WithLabelValues("reinjected"))
		if got == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kp_userspace_udp_handovers_total{result=reinjected} = %v, want 1", got)
		}
	}
}
