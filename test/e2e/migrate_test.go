package e2e

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/test/netns"
)

// A migration is kp started in one mode and switched, with kp migrate
// node, through the targets in order.
type migration struct {
	name    string
	from    mode
	targets []string
	// olderNAT: iptables-nft's nat chains exist before kp starts, as
	// kubelet's and CNI plugins' do on a real node, so they run after
	// kp's nftables chains: a switch to iptables-nft is shadowed until
	// kp's nftables rules go.
	olderNAT bool
}

var migrations = []migration{
	{name: "nftables-iptables-nft-nftables", from: modeNFTables, targets: []string{"iptables-nft", "nftables"}, olderNAT: true},
	{name: "nftables-iptables-legacy", from: modeNFTables, targets: []string{"iptables-legacy"}},
	{name: "nftables-userspace-nftables", from: modeNFTables, targets: []string{"userspace", "nftables"}},
	// In the VM (TestIPVSModeInTheVM): this kernel has no IPVS.
	{name: "ipvs-nftables", from: modeIPVS, targets: []string{"nftables"}},
}

// Services the migrations carry traffic for: web (TCP and UDP) and api on
// ClusterIPs, stream (the long-lived connection) on one pod.
const (
	apiTCP    = "10.96.0.11:80"
	streamTCP = "10.96.0.12:9000"
)

// kp migrate node switches a running kp between modes while a loop of new
// connections, a long-lived connection and a UDP flow run through it, and
// endpoints change in the middle of each switch: no new connection fails,
// the flow loses nothing, the long-lived connection keeps its endpoint,
// the new mode serves the new endpoints, and afterwards every backend
// lists only the target mode's rules.
func TestMigrateNodeSwitchesModesDroppingNothing(t *testing.T) {
	netns.Require(t, "nft", "iptables-nft-save", "iptables-legacy-save", "ip6tables-nft-save", "ip6tables-legacy-save")
	t.Parallel()
	for _, mg := range migrations {
		t.Run(mg.name, func(t *testing.T) {
			onlyWithIPVSInTheVM(t, mg.from.ipvs)
			from := mg.from
			if from.ipvs {
				// The UDP flow's virtual server stays while IPVS tracks
				// the flow: until this long after its last packet.
				from.args = append(slices.Clone(from.args), "--ipvs-udp-timeout", "10s")
			}
			e := newEnv(t, from, 5)
			pods := e.w.Pods()
			streamServer(t, pods[4])
			api := Service{Name: "api", ClusterIPs: []string{"10.96.0.11"},
				Ports: []Port{{Name: "http", Port: 80, TargetPort: 8080}}, Endpoints: endpoints(pods[1], pods[2])}
			stream := Service{Name: "stream", ClusterIPs: []string{"10.96.0.12"},
				Ports: []Port{{Name: "s", Port: 9000, TargetPort: 9090}}, Endpoints: endpoints(pods[4])}
			e.write("web.yaml", web(pods[0], pods[1], pods[2]))
			e.write("api.yaml", api)
			e.write("stream.yaml", stream)
			if mg.olderNAT {
				// Rules that match nothing (TEST-NET-1), in the chains the
				// verify probes (OUTPUT) and the clients (PREROUTING) pass.
				for _, chain := range []string{"PREROUTING", "OUTPUT"} {
					if out, err := e.w.Exec(e.w.Node(), "iptables-nft", "-t", "nat", "-A", chain, "-d", "192.0.2.1/32", "-j", "RETURN"); err != nil {
						t.Fatalf("an older iptables-nft nat chain: %v\n%s", err, out)
					}
				}
			}
			e.startKP()
			client := e.w.Client()
			for _, a := range []string{webTCP, apiTCP} {
				e.answers(client, "tcp", a)
			}
			e.answers(client, "udp", webUDP)
			e.expectOnly(mg.from.name)

			// The plan alone changes nothing.
			out := e.migrate("--to", mg.targets[0], "--dry-run")
			for _, want := range []string{"Plan (to " + mg.targets[0] + ")", "3. remove", "Dry run: nothing changed."} {
				if !strings.Contains(out, want) {
					t.Errorf("dry run output lacks %q:\n%s", want, out)
				}
			}
			e.expectOnly(mg.from.name)

			tr := startTraffic(t, client, []string{webTCP, apiTCP}, streamTCP, webUDP)
			// Traffic started while kp runs userspace: its connections
			// are kp's own sockets, not conntrack entries.
			var inUserspace *traffic
			apiPods := []*netns.Pod{pods[1], pods[2]}
			for i, target := range mg.targets {
				time.Sleep(500 * time.Millisecond)
				// The endpoints change while the switch runs.
				apiPods = []*netns.Pod{pods[(i+2)%4], pods[(i+3)%4]}
				api.Endpoints = endpoints(apiPods...)
				type result struct {
					out string
					err error
				}
				done := make(chan result, 1)
				go func() { out, err := e.tryMigrate("--to", target); done <- result{out, err} }()
				time.Sleep(150 * time.Millisecond)
				e.write("api.yaml", api)
				res := <-done
				if res.err != nil {
					t.Fatalf("kp migrate node --to %s: %v\n%s\nkp's log:\n%s", target, res.err, res.out, tail(e.kp.Log(), 60))
				}
				out := res.out
				t.Logf("kp migrate node --to %s:\n%s", target, out)
				if mg.from.ipvs {
					// IPVS drops the packets of a connection whose virtual
					// server is gone: the long-lived connection's and the
					// UDP flow's stay until they end, the rest goes.
					e.ipvsKeptOnly(streamTCP, webUDP)
				} else {
					e.expectOnly(target)
				}
				wantMode, _, _ := strings.Cut(target, "-")
				if _, body, err := netns.HTTPGet(e.w.Node(), "http://"+metricsAddr+"/proxyMode", 2*time.Second); err != nil || body != wantMode {
					t.Errorf("/proxyMode says %q (%v), want %s", body, err, wantMode)
				}
				// The change made during the switch lands with the next sync,
				// in the new mode.
				e.onlyFrom(client, apiTCP, apiPods...)
				if target == "userspace" && i < len(mg.targets)-1 {
					inUserspace = startTraffic(t, client, []string{webTCP, apiTCP}, streamTCP, webUDP)
				}
				if !mg.from.ipvs {
					e.nothingToDo(target)
				}
			}
			time.Sleep(500 * time.Millisecond)
			tr.stop("")
			if inUserspace != nil {
				t.Log("traffic started in userspace:")
				inUserspace.stop("")
			}
			if mg.from.ipvs {
				last := mg.targets[len(mg.targets)-1]
				e.eventually("the ipvs mode's last virtual server removed once its connection ended", time.Minute,
					func() error { return noIPVSState(e.w) })
				e.expectOnly(last)
				e.nothingToDo(last)
			}
		})
	}
}

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
	cmd := append([]string{kp, "migrate", "node", "--status-socket", e.socket, "--timeout", slow(time.Minute).String()}, args...)
	return e.w.Exec(e.w.Node(), cmd...)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// rulesOf lists, per backend, what of kp's and kube-proxy's is in the node
// namespace: the nftables tables kp, kp-userspace and kube-proxy, and the
// KP-/KUBE- chains in each iptables flavor and family (kubelet's own KUBE-
// chains are not kube-proxy's and are left out).
func (e *env) rulesOf() map[string][]string {
	e.t.Helper()
	out := map[string][]string{}
	tables, err := e.w.NFT("list", "tables")
	if err != nil {
		e.t.Fatalf("nft list tables: %v", err)
	}
	for _, l := range strings.Split(tables, "\n") {
		f := strings.Fields(l)
		if len(f) == 3 && slices.Contains([]string{"kp", "kp-userspace", "kube-proxy"}, f[2]) {
			out["nftables"] = append(out["nftables"], f[1]+" "+f[2])
		}
	}
	for _, bin := range []string{"iptables-nft-save", "ip6tables-nft-save", "iptables-legacy-save", "ip6tables-legacy-save"} {
		save, err := e.w.Exec(e.w.Node(), bin)
		if err != nil {
			e.t.Fatalf("%s: %v\n%s", bin, err, save)
		}
		for _, l := range strings.Split(save, "\n") {
			if strings.HasPrefix(l, ":KP-") || (strings.HasPrefix(l, ":KUBE-") && !kubeletChain(l)) {
				name, _, _ := strings.Cut(l[1:], " ")
				out[bin] = append(out[bin], name)
			}
		}
	}
	return out
}

func kubeletChain(l string) bool {
	for _, c := range []string{"KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT", "KUBE-MARK-DROP"} {
		if strings.HasPrefix(l, ":"+c+" ") {
			return true
		}
	}
	return false
}

// expectOnly checks that the node has the rules of kp's target mode and
// nobody else's, backend by backend.
func (e *env) expectOnly(target string) {
	e.t.Helper()
	got := e.rulesOf()
	check := func(backend string, present bool, what func(string) bool) {
		var mine, others []string
		for _, x := range got[backend] {
			if what(x) {
				mine = append(mine, x)
			} else {
				others = append(others, x)
			}
		}
		if len(others) > 0 {
			e.t.Errorf("kp runs %s, but %s still lists %v", target, backend, others)
		}
		if present && len(mine) == 0 {
			e.t.Errorf("kp runs %s, but %s lists none of its rules", target, backend)
		}
	}
	isTable := func(name string) func(string) bool {
		return func(x string) bool { return strings.HasSuffix(x, " "+name) }
	}
	never := func(string) bool { return false }
	kpChains := func(x string) bool { return strings.HasPrefix(x, "KP-") }
	// The ipvs mode's own chains are in iptables-nft (modeIPVS), beside
	// its virtual servers and ipsets.
	inNFT := target == "iptables-nft" || target == "ipvs"
	if target != "ipvs" {
		if err := noIPVSState(e.w); err != nil {
			e.t.Errorf("kp runs %s: %v", target, err)
		}
	}
	switch target {
	case "nftables":
		check("nftables", true, isTable("kp"))
	case "userspace":
		check("nftables", true, isTable("kp-userspace"))
	default:
		check("nftables", false, never)
	}
	check("iptables-nft-save", inNFT, func(x string) bool { return inNFT && kpChains(x) })
	check("ip6tables-nft-save", false, func(x string) bool { return inNFT && kpChains(x) })
	check("iptables-legacy-save", target == "iptables-legacy", func(x string) bool { return target == "iptables-legacy" && kpChains(x) })
	check("ip6tables-legacy-save", false, func(x string) bool { return target == "iptables-legacy" && kpChains(x) })
	if e.t.Failed() {
		e.t.Logf("rules on the node: %v", fmt.Sprint(got))
	}
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
