package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kpproxy/kp/test/apiserver"
	"github.com/kpproxy/kp/test/netns"
)

// TestKF10UpstreamIPVSStreamWithoutKp is KF-10's experiment
// (docs/known-flakes.md), in the VM only (KP_VM_E2E_RUN selects it):
// upstream kube-proxy's ipvs mode serves the migration test's traffic
// (new connections, the long-lived connection to 10.96.0.12:9000, the UDP
// flow) in three phases of a minute each, with the node's conntrack
// events on the long-lived connection's ports recorded (conntrack -E) and
// its entries sampled every second: "alone" (no kp, nothing written),
// "sysctls" (no kp; at +8 s the sysctls kp proxy writes at start,
// nf_conntrack_acct and nf_conntrack_timestamp turned on, the TCP
// timeouts written, then the two toggled every 3 s), "kp" (kp nftables
// started 0.3 s after the traffic, as the migration test starts it). A
// phase fails when its long-lived connection breaks. The phases start once
// the node tracks connections (conntrackTracks), as the migration test's.
func TestKF10UpstreamIPVSStreamWithoutKp(t *testing.T) {
	if os.Getenv("KP_VM") != "1" {
		t.Skip("KF-10's experiment runs in the VM (KP_VM_E2E_RUN)")
	}
	netns.Require(t, "nft", "conntrack", "ipvsadm", "ipset", "tcpdump")
	requireIPVS(t)
	k := newKubeEnv(t, modeNFTables, 5, apiserver.Options{})
	e := k.env
	pods := e.w.Pods()
	streamServer(t, pods[4])
	k.apply(web(pods[0], pods[1], pods[2]))
	k.apply(Service{Name: "api", ClusterIPs: []string{"10.96.0.11"},
		Ports: []Port{{Name: "http", Port: 80, TargetPort: 8080}}, Endpoints: endpoints(pods[1], pods[2])})
	k.apply(Service{Name: "stream", ClusterIPs: []string{"10.96.0.12"},
		Ports: []Port{{Name: "s", Port: 9000, TargetPort: 9090}}, Endpoints: endpoints(pods[4])})
	kubeProxy := netns.StartInNet(t, e.w.Node(), apiserver.Bin(t, apiserver.KubeProxy),
		"--proxy-mode=ipvs", "--hostname-override", nodeName, "--kubeconfig", k.source[1],
		"--cluster-cidr", e.w.ClusterCIDR(), "--conntrack-max-per-core=0", "--iptables-sync-period=5s",
		"--healthz-bind-address", "127.0.0.1:20256", "--metrics-bind-address", "127.0.0.1:20249",
		"--v", "2", "--ipvs-udp-timeout=10s")
	if err := kubeProxy.WaitHTTP("http://127.0.0.1:20256/healthz", slow(2*time.Minute), func(code int, _ string) bool { return code == 200 }); err != nil {
		t.Fatalf("kube-proxy: %v\n%s", err, tail(kubeProxy.Log(), 40))
	}
	client := e.w.Client()
	for _, a := range []string{webTCP, apiTCP} {
		e.answers(client, "tcp", a)
	}
	// Without this wait the first run (2026-11-27 21:09 UTC) broke the
	// "alone" phase: kube-proxy's first iptables-restore (21:09:14.7-22.3)
	// turned conntrack on mid-connection.
	e.conntrackTracks(client, webTCP)
	node := e.w.Node()
	sysctl := func(name string) string {
		out, _ := e.w.Exec(node, "cat", filepath.Join("/proc/sys/net/netfilter", name))
		return strings.TrimSpace(out)
	}
	write := func(name, v string) {
		if out, err := e.w.Exec(node, "sh", "-c", fmt.Sprintf("echo %s > /proc/sys/net/netfilter/%s", v, name)); err != nil {
			t.Logf("write %s=%s: %v %s", name, v, err, out)
		}
	}
	names := []string{"nf_conntrack_acct", "nf_conntrack_timestamp", "nf_conntrack_tcp_timeout_established",
		"nf_conntrack_tcp_timeout_close_wait", "nf_conntrack_tcp_loose", "nf_conntrack_tcp_be_liberal"}
	showSysctls := func(when string) {
		var b []string
		for _, n := range names {
			b = append(b, n+"="+sysctl(n))
		}
		t.Logf("%s: %s", when, strings.Join(b, " "))
	}
	showSysctls("sysctls after kube-proxy started")
	vsConntrack, _ := e.w.Exec(node, "cat", "/proc/sys/net/ipv4/vs/conntrack")
	t.Logf("net.ipv4.vs.conntrack=%s", strings.TrimSpace(vsConntrack))

	broken := map[string]string{}
	for _, phase := range []string{"alone", "sysctls", "kp"} {
		events := startLineCapture(node, true, nil, "conntrack", "-E", "-p", "tcp", "-o", "timestamp") // with the kernel's timestamps
		stopSample := sampleStreamEntries(t, e.w.Exec, node, phase)
		start := time.Now()
		tr := startFlows(t, flows{loops: []loopFlow{{name: "from " + client, ns: client, addrs: []string{webTCP, apiTCP}}},
			stream: flowTo{client, streamTCP}, udp: flowTo{client, webUDP}, capture: node})
		local := tr.long.conn.LocalAddr().String()
		t.Logf("phase %s: the long-lived connection from %s, started %s", phase, local, start.Format("15:04:05.000"))
		phaseEnd := start.Add(60 * time.Second)
		switch phase {
		case "sysctls":
			time.Sleep(8 * time.Second)
			t.Logf("phase %s: writing the sysctls at %s", phase, time.Now().Format("15:04:05.000"))
			write("nf_conntrack_acct", "1")
			write("nf_conntrack_timestamp", "1")
			write("nf_conntrack_tcp_timeout_established", "86400")
			write("nf_conntrack_tcp_timeout_close_wait", "3600")
			showSysctls("phase sysctls, written")
			for on := false; time.Now().Before(phaseEnd); on = !on {
				time.Sleep(3 * time.Second)
				v := map[bool]string{true: "1", false: "0"}[on]
				write("nf_conntrack_acct", v)
				write("nf_conntrack_timestamp", v)
			}
			write("nf_conntrack_acct", "0")
			write("nf_conntrack_timestamp", "0")
		case "kp":
			time.Sleep(300 * time.Millisecond)
			t.Logf("phase %s: starting kp at %s", phase, time.Now().Format("15:04:05.000"))
			e.startKP()
			t.Logf("phase %s: kp healthy at %s", phase, time.Now().Format("15:04:05.000"))
			phaseEnd = time.Now().Add(30 * time.Second)
		}
		for time.Now().Before(phaseEnd) {
			tr.long.mu.Lock()
			err := tr.long.err
			tr.long.mu.Unlock()
			if err != nil {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		tr.long.mu.Lock()
		longErr := tr.long.err
		tr.long.mu.Unlock()
		if longErr != nil {
			broken[phase] = longErr.Error()
		}
		time.Sleep(time.Second)
		ipvsConns, _ := e.w.Exec(node, "ipvsadm", "-Lnc")
		stopSample()
		evs := events.stop()
		var mine []string
		for _, l := range evs {
			if strings.Contains(l, "port=9000") || strings.Contains(l, "port=9090") {
				mine = append(mine, l)
			}
		}
		t.Logf("phase %s: %d conntrack events, %d on ports 9000/9090:\n%s", phase, len(evs), len(mine), strings.Join(mine, "\n"))
		var vs []string
		for _, l := range strings.Split(ipvsConns, "\n") {
			if strings.Contains(l, ":9000") {
				vs = append(vs, l)
			}
		}
		t.Logf("phase %s: IPVS connections to :9000 at the end:\n%s", phase, strings.Join(vs, "\n"))
		t.Logf("phase %s: the long-lived connection: %v", phase, longErr)
		tr.stop("")
		if phase == "kp" {
			t.Logf("kp's log:\n%s", tail(e.kp.Log(), 40))
		}
	}
	t.Logf("KF-10 experiment: broken phases %v", broken)
	if len(broken) > 0 {
		t.Errorf("the long-lived connection broke in phases %v", broken)
	}
}

// sampleStreamEntries lists the node's conntrack entries of port 9000
// (the long-lived connection's) every second and logs each change, with
// the wall clock, until the returned func is called.
func sampleStreamEntries(t *testing.T, execIn func(string, ...string) (string, error), ns, phase string) func() {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		last := "?"
		for {
			out, err := execIn(ns, "conntrack", "-L", "-p", "tcp", "--orig-port-dst", "9000")
			var rows []string
			for _, l := range strings.Split(out, "\n") {
				if strings.Contains(l, "dport=9000") {
					f := strings.Fields(l)
					rows = append(rows, strings.Join(f[3:], " ")) // no timeout
				}
			}
			cur := strings.Join(rows, "\n")
			if err != nil {
				cur = "error: " + err.Error()
			}
			if cur != last {
				t.Logf("phase %s: %s: conntrack entries to :9000 now (%d):\n%s", phase, time.Now().Format("15:04:05.000"), len(rows), cur)
				last = cur
			}
			select {
			case <-done:
				return
			case <-time.After(time.Second):
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// A node namespace tracks connections only once a rule that needs conntrack
// is in it (a NAT, masquerade or ct expression: the kernel registers its
// conntrack hooks per namespace on demand since 4.10); IPVS, even with
// net.ipv4.vs.conntrack=1, does not ask for them (only an FTP virtual
// server does). A connection IPVS takes while nothing tracks it runs
// untracked and unmasqueraded; once a rule turns conntrack on, its next
// packet starts a conntrack entry mid-stream, the nat hooks see it as new,
// kube-proxy's masquerade gives it a new source port, and the endpoint
// answers that with a reset (KF-10). With conntrack on before the
// connection starts, its entry (made at its SYN) carries it through the
// same rule unchanged. The kernel fact the migration tests' claim depends
// on: they start their long-lived connection only once the node tracks
// (kubeEnv.conntrackTracks).
func TestKernelIPVSConnectionStartedWhileConntrackIsOffIsResetWhenAMasqueradeComesIn(t *testing.T) {
	netns.Require(t, "ipvsadm", "iptables-nft", "conntrack", "nft")
	requireIPVS(t)
	for _, on := range []bool{false, true} {
		name := map[bool]string{false: "conntrack-off-at-connect", true: "conntrack-on-at-connect"}[on]
		t.Run(name, func(t *testing.T) {
			w := netns.NewWorld(t, netns.Options{Pods: 1})
			node, pod := w.Node(), w.Pods()[0]
			streamServer(t, pod)
			run := func(cmd ...string) {
				t.Helper()
				if out, err := w.Exec(node, cmd...); err != nil {
					t.Fatalf("%v: %v\n%s", cmd, err, out)
				}
			}
			run("sh", "-c", "echo 1 > /proc/sys/net/ipv4/vs/conntrack")
			run("ip", "link", "add", "kube-ipvs0", "type", "dummy")
			run("ip", "addr", "add", "10.96.0.12/32", "dev", "kube-ipvs0")
			run("ipvsadm", "-A", "-t", streamTCP, "-s", "rr")
			run("ipvsadm", "-a", "-t", streamTCP, "-r", pod.IP.String()+":9090", "-m")
			if on {
				// Any rule that needs conntrack: here a counter of invalid
				// packets, in a table of its own.
				run("nft", "add table ip kf10; add chain ip kf10 pre { type filter hook prerouting priority 0 ; }; add rule ip kf10 pre ct state invalid counter")
			}
			// One exchange, then quiet (the client's delayed ACK included),
			// so that the client's next line is the connection's first
			// packet after the rule: a packet from the endpoint first would
			// start the entry from its side, unmasqueraded, and carry the
			// connection on (the race that made KF-10 a flake).
			ctx, cancel := context.WithTimeout(context.Background(), slow(10*time.Second))
			defer cancel()
			conn, err := netns.DialConn(ctx, w.Client(), "tcp", streamTCP)
			if err != nil {
				t.Fatalf("connect to %s: %v", streamTCP, err)
			}
			defer conn.Close()
			r := bufio.NewReader(conn)
			exchange := func(i int) error {
				_ = conn.SetDeadline(time.Now().Add(slow(5 * time.Second)))
				if _, err := fmt.Fprintf(conn, "ping %d\n", i); err != nil {
					return err
				}
				_, err := r.ReadString('\n')
				return err
			}
			if err := exchange(0); err != nil {
				t.Fatalf("first exchange: %v", err)
			}
			time.Sleep(time.Second)
			out, _ := w.Exec(node, "conntrack", "-L", "-p", "tcp", "--orig-port-dst", "9000")
			entries := strings.Count(out, "dport=9000")
			t.Logf("conntrack entries of the connection: %d\n%s", entries, out)
			// kube-proxy's masquerade of traffic from outside the cluster
			// CIDR (its KUBE-POSTROUTING, --random-fully).
			run("iptables-nft", "-t", "nat", "-A", "POSTROUTING", "-s", w.ClientIP().String(), "-d", w.PodCIDR().String(),
				"-j", "MASQUERADE", "--random-fully")
			time.Sleep(500 * time.Millisecond)
			err = exchange(1)
			if err == nil {
				err = exchange(2)
			}
			after, _ := w.Exec(node, "conntrack", "-L", "-p", "tcp", "--orig-port-dst", "9000")
			t.Logf("after the masquerade rule: the connection: %v; conntrack entries:\n%s", err, after)
			switch {
			case on && (entries != 1 || err != nil):
				t.Errorf("with conntrack on at connect: %d entries (want 1), the connection: %v (want unbroken)", entries, err)
			case !on && (entries != 0 || err == nil || !strings.Contains(err.Error(), "reset")):
				t.Errorf("with conntrack off at connect: %d entries (want 0), the connection: %v (want reset by the endpoint): "+
					"the kernel no longer behaves as KF-10's explanation says", entries, err)
			}
		})
	}
}
