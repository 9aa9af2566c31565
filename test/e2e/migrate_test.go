package e2e

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/test/netns"
)

// Services the migrations carry traffic for: web (TCP and UDP) and api on
// ClusterIPs, stream (the long-lived connection) on one pod.
const (
	apiTCP    = "10.96.0.11:80"
	streamTCP = "10.96.0.12:9000"
)

// onlyFrom waits until 20 new connections in a row from ns to addr are
// all answered by pods.
func (e *env) onlyFrom(ns, addr string, pods ...*netns.Pod) {
	e.t.Helper()
	names := e.podNames(pods...)
	e.eventually(fmt.Sprintf("%s answered only by %v", addr, names), 15*time.Second, func() error {
		counts, err := e.answered(ns, "tcp", addr, 20)
		if err != nil {
			return err
		}
		n := 0
		for _, name := range names {
			n += counts[name]
		}
		if n != 20 {
			return fmt.Errorf("answered by %v", counts)
		}
		return nil
	})
}

// nothingToDo checks that re-running kp migrate node --to target finds
// nothing to do.
func (e *env) nothingToDo(target string) {
	e.t.Helper()
	if out := e.migrate("--to", target); !strings.Contains(out, "Nothing to do") {
		e.t.Errorf("re-running kp migrate node --to %s:\n%s", target, out)
	}
}

// migrate runs kp migrate node in the node namespace, failing the test if
// it fails.
func (e *env) migrate(args ...string) string {
	e.t.Helper()
	out, err := e.tryMigrate(args...)
	if err != nil {
		e.t.Fatalf("kp migrate node %v: %v\n%s\nkp's log:\n%s", args, err, out, tail(e.kp.Log(), 40))
	}
	return out
}

// tryMigrate runs kp migrate node in the node namespace (from any
// goroutine).
func (e *env) tryMigrate(args ...string) (string, error) {
	kp, err := netns.Build("./cmd/kp")
	if err != nil {
		return "", err
	}
	cmd := append([]string{kp, "migrate", "node", "--status-address", metricsAddr, "--timeout", slow(time.Minute).String()}, args...)
	return e.w.Exec(e.w.Node(), cmd...)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// kp killed in the middle of a switch (after the target mode is
// programmed, while it verifies) leaves both modes' rules, which both serve;
// restarted, it runs its configured mode and removes the other's; kp
// migrate node run again completes the switch. The traffic loses nothing
// throughout.
func TestMigrateNodeInterruptedMidSwitchIsSafeToReRun(t *testing.T) {
	netns.Require(t, "nft", "iptables-nft-save", "iptables-legacy-save", "ip6tables-nft-save", "ip6tables-legacy-save")
	e := newEnv(t, modeNFTables, 5)
	pods := e.w.Pods()
	streamServer(t, pods[4])
	e.write("web.yaml", web(pods[0], pods[1], pods[2]))
	e.write("api.yaml", Service{Name: "api", ClusterIPs: []string{"10.96.0.11"},
		Ports: []Port{{Name: "http", Port: 80, TargetPort: 8080}}, Endpoints: endpoints(pods[1], pods[2])})
	e.write("stream.yaml", Service{Name: "stream", ClusterIPs: []string{"10.96.0.12"},
		Ports: []Port{{Name: "s", Port: 9000, TargetPort: 9090}}, Endpoints: endpoints(pods[4])})
	// An endpoint that never answers: its probe times out (2 s), which
	// holds the switch in its verify step long enough to kill kp there.
	gone := pods[0].IP.As4()
	gone[3] = 99
	e.write("slow.yaml", Service{Name: "slow", ClusterIPs: []string{"10.96.0.13"},
		Ports:     []Port{{Name: "http", Port: 80, TargetPort: 8080}},
		Endpoints: []Endpoint{{IP: netip.AddrFrom4(gone).String(), NodeName: nodeName}}})
	e.startKP()
	client := e.w.Client()
	e.answers(client, "tcp", webTCP)
	tr := startTraffic(t, client, []string{webTCP, apiTCP}, streamTCP, webUDP)
	time.Sleep(300 * time.Millisecond)

	done := make(chan error, 1)
	go func() { _, err := e.tryMigrate("--to", "iptables-nft"); done <- err }()
	e.logShows("the switch programming iptables-nft", 20*time.Second, "migration: new mode programmed")
	e.kp.Kill()
	if err := <-done; err == nil {
		t.Error("kp migrate node succeeded although kp was killed mid-switch")
	}
	both := e.rulesOf()
	t.Logf("rules after the kill: %v", both)
	if len(both["nftables"]) == 0 || len(both["iptables-nft-save"]) == 0 {
		t.Errorf("after a kill mid-switch both modes' rules should be there: %v", both)
	}
	time.Sleep(500 * time.Millisecond) // the kernel serves without kp
	if err := e.kp.Start(); err != nil {
		t.Fatal(err)
	}
	e.waitHealthy()
	e.eventually("the restarted kp removing the half-done mode", 15*time.Second, func() error {
		if got := e.rulesOf(); len(got["iptables-nft-save"])+len(got["ip6tables-nft-save"]) > 0 {
			return fmt.Errorf("iptables-nft still lists %v", got)
		}
		return nil
	})
	e.expectOnly("nftables")
	out := e.migrate("--to", "iptables-nft")
	if !strings.Contains(out, "verify   5 service ports proven") || !strings.Contains(out, "warning: e2e/slow:http") {
		t.Errorf("re-run:\n%s", out)
	}
	e.expectOnly("iptables-nft")
	time.Sleep(500 * time.Millisecond)
	tr.stop("")
}
