package userspace

import (
	"context"
	"errors"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
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
