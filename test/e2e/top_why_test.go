package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/test/netns"
	"github.com/kpproxy/kp/test/tmux"
)

// kp top shows the why, in a real terminal: each endpoint's reason (kp
// explain's), a flow pinned to an endpoint that is gone, a UDP entry no
// endpoint ever answered, and kp explain's answer behind x.
//
// The conditions are made deterministic: the flow pinned to a gone
// endpoint is TCP, which kp's conntrack cleaner leaves to TCP (it deletes
// only UDP and SCTP entries, right after the sync that removed the
// endpoint, so a UDP one would race the screen); the client keeps its
// socket open, so the entry lives (CLOSE_WAIT, 60 s) long after the echo
// server's answer. The unanswered UDP entry goes to an endpoint address no
// pod has: its entry stays UNREPLIED while the client sends, and the
// cleaner keeps it (the endpoint is still the Service's).
func TestKpTopShowsWhyGoneEndpointsAndUnrepliedUDPInATerminal(t *testing.T) {
	netns.Require(t, "tmux")
	e := newEnv(t, modeNFTables, 3)
	pods := e.w.Pods()
	cart := Service{Namespace: "shop", Name: "cart", ClusterIPs: []string{"10.96.0.40"},
		Ports:     []Port{{Name: "http", Port: 80, TargetPort: 8080}},
		Endpoints: []Endpoint{{IP: pods[0].IP.String(), NodeName: nodeName}, {IP: pods[1].IP.String(), NodeName: nodeName}}}
	// pods[2] is not ready: never chosen, and top says why.
	cart.Endpoints = append(cart.Endpoints, Endpoint{IP: pods[2].IP.String(), NodeName: nodeName, Ready: Bool(false)})
	nobody := e.w.PodCIDR().Addr().As4()
	nobody[3] = 200 // in the pods' range, but no pod has it
	void := Service{Namespace: "shop", Name: "void", ClusterIPs: []string{"10.96.0.41"},
		Ports:     []Port{{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, TargetPort: 5353}},
		Endpoints: []Endpoint{{IP: netip.AddrFrom4(nobody).String(), NodeName: nodeName}}}
	e.write("shop.yaml", cart, void)
	e.startKP()
	e.answers(e.w.Client(), "tcp", "10.96.0.40:80")

	kp, err := netns.Build("./cmd/kp")
	if err != nil {
		t.Fatal(err)
	}
	tm := tmux.Start(t, 150, 40, fmt.Sprintf("NO_COLOR=1 %s top --netns %s --status-socket %s --refresh 1s",
		kp, e.w.Node(), e.socket))
	wait := func(what string, cond func(screen string) error) string {
		t.Helper()
		var last string
		e.eventually(what, 30*time.Second, func() error {
			last = tm.Screen()
			if strings.Contains(last, "[exited") && !strings.Contains(what, "quits") {
				t.Fatalf("kp top exited:\n%s", last)
			}
			return cond(last)
		})
		return last
	}
	wait("the Services view lists the test's Services", func(s string) error {
		if !strings.Contains(s, "shop/cart:http") || !strings.Contains(s, "shop/void:dns") {
			return fmt.Errorf("no shop Services:\n%s", s)
		}
		return nil
	})

	// A UDP client that nothing answers, and a TCP connection left open.
	udp := e.startUDPClient(e.w.Client(), "10.96.0.41:53")
	tcp, err := netns.DialConn(context.Background(), e.w.Client(), "tcp", "10.96.0.40:80")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	tcpSrc := netip.MustParseAddrPort(tcp.LocalAddr().String())
	var pinned netip.AddrPort
	e.eventually("the TCP connection's conntrack entry", 10*time.Second, func() error {
		for _, f := range e.conntrackFrom(tcpSrc) {
			pinned = f.Reply.Src
			return nil
		}
		return fmt.Errorf("no entry from %s", tcpSrc)
	})
	// The endpoint the connection went to leaves the Service; the
	// connection's entry stays, pinned to it.
	var kept []Endpoint
	for _, ep := range cart.Endpoints {
		if ep.IP != pinned.Addr().String() {
			kept = append(kept, ep)
		}
	}
	if len(kept) != 2 {
		t.Fatalf("the TCP connection went to %s, not to a ready endpoint of shop/cart", pinned)
	}
	cart.Endpoints = kept
	e.write("shop.yaml", cart, void)

	// The Services view counts, per Service: GONE/UNR.
	trouble := regexp.MustCompile(`\s(\d+)/(\d+)\s+\S+\s*$`) // GONE/UNR, then BYTES/S
	services := wait("the Services view counts the pinned flow and the unanswered UDP entry", func(s string) error {
		c, v := trouble.FindStringSubmatch(lineWith(s, "shop/cart:http")), trouble.FindStringSubmatch(lineWith(s, "shop/void:dns"))
		switch {
		case c == nil || v == nil:
			return fmt.Errorf("no GONE/UNR on the shop rows:\n%s", s)
		case c[1] == "0":
			// e.answers' connection, in TIME_WAIT, may be pinned too.
			return fmt.Errorf("shop/cart:http GONE/UNR %s/%s, want a flow pinned to a gone endpoint:\n%s", c[1], c[2], s)
		case v[2] == "0":
			return fmt.Errorf("shop/void:dns GONE/UNR %s/%s, want an unreplied entry:\n%s", v[1], v[2], s)
		}
		return nil
	})
	// Highlighted: bold under NO_COLOR (the cursor's row is reversed
	// instead; it is on the first row, e2e/web's).
	if l := lineWith(tm.Run("capture-pane", "-p", "-e"), "shop/void:dns"); !regexp.MustCompile(`\x1b\[(?:[0-9;]*;)?1[;m]`).MatchString(l) {
		t.Errorf("shop/void:dns's row is not highlighted: %q", l)
	}

	// The flows view: the pinned flow's endpoint is gone; the UDP entry
	// is UNREPLIED.
	tm.Keys(":", "flows", "Enter")
	flows := wait("the flows view shows the gone endpoint and the unanswered entry", func(s string) error {
		if l := lineWith(s, tcpSrc.String()); !strings.Contains(l, pinned.String()) || !strings.Contains(l, " gone ") {
			return fmt.Errorf("the flow from %s is not shown pinned to gone %s: %q\n%s", tcpSrc, pinned, l, s)
		}
		if l := lineWith(s, udp.source().String()); !strings.Contains(l, "shop/void:dns") || !strings.Contains(l, "UNREPLIED") {
			return fmt.Errorf("the UDP flow from %s is not shown UNREPLIED: %q\n%s", udp.source(), l, s)
		}
		return nil
	})

	// x on the UDP flow: kp explain's answer for its destination from its
	// source, with the entry itself.
	tm.Keys("/", strings.ReplaceAll(udp.source().String(), ".", `\.`), "Enter", "x")
	explained := wait("x on the flow opens kp explain's answer", func(s string) error {
		flat := strings.Join(strings.Fields(s), " ")
		for _, want := range []string{"kp explain from " + udp.source().String() + " to 10.96.0.41:53/udp", "verdict: DNAT",
			"service: shop/void UDP/53", netip.AddrFrom4(nobody).String() + ":5353", "UNREPLIED"} {
			if !strings.Contains(flat, want) {
				return fmt.Errorf("no %q:\n%s", want, s)
			}
		}
		return nil
	})

	// The Service's detail: each endpoint's reason, and the pinned flow.
	tm.Keys("Escape", "Escape", ":", "svc", "Enter", "/", "cart:http", "Enter", "Enter")
	detail := wait("the detail view says why each endpoint is chosen or not", func(s string) error {
		for _, p := range pods {
			l := lineWith(s, p.IP.String()+":8080 ")
			switch {
			case p.IP == pinned.Addr():
				if l != "" && !strings.Contains(l, "gone") {
					return fmt.Errorf("the removed endpoint %s is still listed: %q", p.IP, l)
				}
			case p.IP == pods[2].IP:
				if !strings.Contains(l, "not-ready") || !strings.Contains(l, "✗ not-ready") || !strings.Contains(l, "0%/") {
					return fmt.Errorf("not-ready endpoint %s: %q\n%s", p.IP, l, s)
				}
			case !strings.Contains(l, "✓ ready") || !strings.Contains(l, "100%/"):
				return fmt.Errorf("the one ready endpoint %s: %q\n%s", p.IP, l, s)
			}
		}
		if !regexp.MustCompile(`[1-9]\d* pinned to gone endpoints`).MatchString(s) {
			return fmt.Errorf("the pinned flow is not counted:\n%s", s)
		}
		return nil
	})

	// x on the Service (its own flows table has the cursor: the pinned
	// flow's explanation lists the entry with the gone endpoint).
	tm.Keys("Escape", "x")
	service := wait("x on the Service opens kp explain's answer for its ClusterIP", func(s string) error {
		flat := strings.Join(strings.Fields(s), " ")
		for _, want := range []string{"explain 10.96.0.40:80/tcp", "verdict: DNAT", "DNAT to one of 1 endpoint(s)",
			"not-ready no -", pods[2].IP.String() + ":8080"} {
			if !strings.Contains(flat, want) {
				return fmt.Errorf("no %q:\n%s", want, s)
			}
		}
		return nil
	})
	tm.Keys("q")
	wait("q quits", func(s string) error {
		if !strings.Contains(s, "[exited 0]") {
			return fmt.Errorf("not exited:\n%s", s)
		}
		return nil
	})
	t.Logf("services:\n%s\nflows:\n%s\nexplain (flow):\n%s\ndetail:\n%s\nexplain (service):\n%s", services, flows, explained, detail, service)
}
