package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/test/netns"
	"github.com/kpproxy/kp/test/tmux"
)

// sgrColour matches an SGR sequence that sets a foreground or background
// colour.
var sgrColour = regexp.MustCompile(`\x1b\[(?:[0-9;]*;)?(?:3[0-8]|4[0-8]|9[0-7]|10[0-7])(?:;[0-9;]*)?m`)

// kpTopCaptureDir, when set, is where the test writes what kp top showed
// (docs/tools.md's screens come from there).
const kpTopCaptureDir = "KP_TOP_CAPTURE_DIR"

func TestKpTopShowsServicesEndpointSharesAndLiveFlowsInATerminal(t *testing.T) {
	netns.Require(t, "tmux")
	e := newEnv(t, modeNFTables, 3)
	pods := e.w.Pods()
	// IPv4 endpoints only: every endpoint must see traffic from the test's
	// IPv4 client.
	var eps []Endpoint
	for _, p := range pods {
		eps = append(eps, Endpoint{IP: p.IP.String(), NodeName: nodeName})
	}
	shop := Service{Namespace: "shop", Name: "cart", ClusterIPs: []string{"10.96.0.40"}, Type: v1.ServiceTypeNodePort,
		Ports: []Port{
			{Name: "http", Port: 80, TargetPort: 8080, NodePort: 30080},
			{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, TargetPort: 5353, NodePort: 30053},
		}, Endpoints: eps}
	e.write("shop.yaml", shop, web(pods[0]))

	kp, err := netns.Build("./cmd/kp")
	if err != nil {
		t.Fatal(err)
	}
	tm := tmux.Start(t, 100, 30, fmt.Sprintf("NO_COLOR=1 %s top --netns %s --status-socket %s --refresh 1s",
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
	has := func(want ...string) func(string) error {
		return func(s string) error {
			for _, w := range want {
				if !strings.Contains(s, w) {
					return fmt.Errorf("no %q on screen:\n%s", w, s)
				}
			}
			return nil
		}
	}

	// kp top starts before kp proxy: it says so, and keeps trying.
	wait("kp top says the status API cannot be reached", func(s string) error {
		flat := strings.Join(strings.Fields(s), " ")
		// No socket yet (kp proxy makes it): "no such file or directory";
		// a stale one: "connection refused".
		if !strings.Contains(flat, "cannot reach kp proxy's status API") ||
			!strings.Contains(flat, "no such file or directory") && !strings.Contains(flat, "connection refused") ||
			!strings.Contains(flat, "(retrying every 1s)") {
			return fmt.Errorf("no clear error on screen:\n%s", s)
		}
		return nil
	})
	e.startKP()
	e.answers(e.w.Client(), "tcp", "10.96.0.40:80")

	// The Services view lists the test's Services.
	wait("the Services view lists the test's Services", has("shop/cart:http", "shop/cart:dns", "e2e/web:http", "e2e/web:dns", "mode nftables"))

	// Real traffic: enough TCP connections that every endpoint gets some,
	// and UDP clients that stay open while the screens are read.
	counts := e.spread(t, e.w.Client(), "tcp", "10.96.0.40:80", 60)
	for _, p := range pods {
		if counts[p.Name] == 0 {
			t.Fatalf("the test's own traffic missed %s: %v", p.Name, counts)
		}
	}
	var clients []string
	for i := 0; i < 2; i++ {
		c := e.startUDPClient(e.w.Client(), "10.96.0.40:53")
		e.waitFor(c, "udp to shop/cart:dns answers", time.Time{}, 15*time.Second, func(ev udpEvent) bool { return ev.From != "" })
		clients = append(clients, c.source().String())
	}
	// Steady traffic while the screens are read, so rates are not zero.
	stop := make(chan struct{})
	var traffic sync.WaitGroup
	traffic.Add(1)
	go func() {
		defer traffic.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
				_, _ = e.ask(e.w.Client(), "tcp", "10.96.0.40:80")
			}
		}
	}()
	defer func() { close(stop); traffic.Wait() }()

	// Columns from the right: … READY CONN/S FLOWS GONE/UNR BYTES/S.
	row := regexp.MustCompile(`(\d+)/(\d+)\s+(\S+)\s+(\d+)\s+\d+/\d+\s+(\S+)\s*$`)
	services := wait("the Services view shows rates and flows", func(s string) error {
		http, dns := row.FindStringSubmatch(lineWith(s, "shop/cart:http")), row.FindStringSubmatch(lineWith(s, "shop/cart:dns"))
		switch {
		case http == nil || dns == nil:
			return fmt.Errorf("no rows for shop/cart:\n%s", s)
		case http[1] != "3" || http[2] != "3":
			return fmt.Errorf("shop/cart:http endpoints ready %s/%s, want 3/3", http[1], http[2])
		case http[3] == "-" || http[3] == "0" || http[5] == "-" || http[5] == "0B":
			return fmt.Errorf("shop/cart:http shows no new connections/s or bytes/s: %q", http[0])
		case dns[4] == "0":
			return fmt.Errorf("shop/cart:dns shows no flows: %q", dns[0])
		}
		return nil
	})

	// Filter down to the HTTP port and open it: every endpoint has a
	// non-zero share of the new connections since kp began counting.
	tm.Keys("/", "cart:http", "Enter")
	wait("the filter leaves one Service port", func(s string) error {
		if strings.Contains(s, "e2e/web") || !strings.Contains(s, "filter /cart:http/") {
			return fmt.Errorf("filter not applied:\n%s", s)
		}
		return nil
	})
	tm.Keys("Enter")
	detail := wait("the detail view shows every endpoint with a share", func(s string) error {
		if !strings.Contains(s, "shop/cart:http  TCP  NodePort  port 80  nodePort 30080") {
			return fmt.Errorf("not the detail of shop/cart:http:\n%s", s)
		}
		for _, p := range pods {
			l := lineWith(s, p.IP.String()+":8080")
			share := regexp.MustCompile(`(\d+)%\s*$`).FindStringSubmatch(l)
			if share == nil || share[1] == "0" {
				return fmt.Errorf("endpoint %s (%s): line %q has no non-zero share since start", p.IP, p.Name, l)
			}
		}
		return nil
	})

	// Back, then the flows view: the UDP clients' flows, live.
	tm.Keys("Escape")
	wait("esc goes back to the Services view", has("<services>"))
	tm.Keys(":", "flows", "Enter")
	flows := wait("the flows view lists the test's live connections", func(s string) error {
		for _, c := range clients {
			l := lineWith(s, c)
			if !strings.Contains(l, "shop/cart:dns") || !strings.Contains(l, ":5353") {
				return fmt.Errorf("no flow line from %s to shop/cart:dns: %q\n%s", c, l, s)
			}
		}
		return nil
	})

	// The terminal shrinks to 80x24: kp top redraws to fit, footer last.
	tm.Run("resize-window", "-x", "80", "-y", "24")
	wait("kp top follows the resize", func(s string) error {
		lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
		if len(lines) != 24 || !strings.Contains(lines[23], "q quit") || !strings.Contains(s, clients[0]) {
			return fmt.Errorf("not redrawn for 80x24:\n%s", s)
		}
		return nil
	})
	// NO_COLOR: attributes, but no colour, reach the terminal.
	if colour := sgrColour.FindString(tm.Run("capture-pane", "-p", "-e")); colour != "" {
		t.Errorf("colour sequence %q on screen under NO_COLOR", colour)
	}

	tm.Keys("q")
	wait("q quits", has("[exited 0]"))

	if dir := os.Getenv(kpTopCaptureDir); dir != "" {
		for name, s := range map[string]string{"services": services, "detail": detail, "flows": flows} {
			if err := os.WriteFile(filepath.Join(dir, "kp-top-"+name+".txt"), []byte(s), 0o644); err != nil {
				t.Error(err)
			}
		}
	}
	t.Logf("services:\n%s\ndetail:\n%s\nflows:\n%s", services, detail, flows)
}
