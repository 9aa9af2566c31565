package netns

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

func addr(ip netip.Addr, port int) string { return netip.AddrPortFrom(ip, uint16(port)).String() }

func TestWorldPodsAnswerByPodIP(t *testing.T) {
	t.Parallel()
	w := NewWorld(t, Options{Pods: 3})
	if got := len(w.Pods()); got != 3 {
		t.Fatalf("pods: got %d, want 3", got)
	}
	for _, p := range w.Pods() {
		for _, c := range []struct {
			from, network string
			ip            netip.Addr
			port          int
			seen          netip.Addr // source the pod must see
		}{
			{w.Node(), "tcp", p.IP, 8080, w.GatewayIP()},
			{w.Node(), "tcp", p.IP, 8081, w.GatewayIP()},
			{w.Node(), "udp", p.IP, 5353, w.GatewayIP()},
			{w.Node(), "udp", p.IP, 5354, w.GatewayIP()},
			{w.Node(), "tcp", p.IP6, 8080, w.GatewayIP6()},
			{w.Node(), "udp", p.IP6, 5353, w.GatewayIP6()},
			{w.Client(), "tcp", p.IP, 8080, w.ClientIP()},
			{w.Client(), "udp", p.IP, 5353, w.ClientIP()},
			{w.Client(), "tcp", p.IP6, 8080, w.ClientIP6()},
			{w.Client(), "udp", p.IP6, 5353, w.ClientIP6()},
		} {
			a := addr(c.ip, c.port)
			reply, err := w.Dial(c.from, c.network, a, 3*time.Second)
			if err != nil {
				t.Errorf("%s from %s to %s: %v", c.network, c.from, a, err)
				continue
			}
			name, client := ParseReply(reply)
			ap, perr := netip.ParseAddrPort(client)
			if name != p.Name || perr != nil || ap.Addr() != c.seen {
				t.Errorf("%s from %s to %s: reply %q, want %q from %s", c.network, c.from, a, reply, p.Name, c.seen)
			}
		}
	}
	// Pod to pod, across the bridge.
	pods := w.Pods()
	reply, err := w.Dial(pods[0].NS, "tcp", addr(pods[1].IP, 8080), 3*time.Second)
	if want := pods[1].Name + " " + pods[0].IP.String() + ":"; err != nil || !strings.HasPrefix(reply, want) {
		t.Errorf("pod-0 to pod-1: reply %q, err %v; want %q…", reply, err, want)
	}
}

func TestServiceAddressWithoutRuleIsDroppedNotRefused(t *testing.T) {
	t.Parallel()
	w := NewWorld(t, Options{})
	// No kp: the node routes Service addresses to the client, which does
	// not forward and drops them silently. So a refusal seen by an e2e test
	// came from kp's rules, not from the harness.
	for _, ns := range []string{w.Node(), w.Client()} {
		for _, network := range []string{"tcp", "udp"} {
			for _, a := range []string{"10.96.0.10:80", "[fd00:96::10]:80"} {
				_, err := w.Dial(ns, network, a, 300*time.Millisecond)
				var ne net.Error
				if !errors.As(err, &ne) || !ne.Timeout() {
					t.Errorf("%s from %s to %s: got %v, want a timeout", network, ns, a, err)
				}
			}
		}
	}
	// The route is there, though: the lookup does not fail.
	out, err := w.Exec(w.Node(), "ip", "route", "get", "10.96.0.10")
	if err != nil || !strings.Contains(out, "via "+w.ClientIP().String()) {
		t.Errorf("node route to 10.96.0.10: %q, %v; want via the client", out, err)
	}
}

func TestNodeSysctlsAndRootUntouched(t *testing.T) {
	t.Parallel()
	rootForward, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	w := NewWorld(t, Options{})
	for key, want := range map[string]string{
		"net.ipv4.ip_forward":                 "1",
		"net.ipv6.conf.all.forwarding":        "1",
		"net.bridge.bridge-nf-call-iptables":  "1",
		"net.bridge.bridge-nf-call-ip6tables": "1",
	} {
		path := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
		out, err := w.Exec(w.Node(), "cat", path)
		if err != nil || strings.TrimSpace(out) != want {
			t.Errorf("node %s = %q (%v), want %s", key, out, err, want)
		}
	}
	out, err := w.Exec(w.Client(), "cat", "/proc/sys/net/ipv4/ip_forward")
	if err != nil || strings.TrimSpace(out) != "0" {
		t.Errorf("client forwards: ip_forward = %q (%v)", out, err)
	}
	if after, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); string(after) != string(rootForward) {
		t.Errorf("root ip_forward changed from %q to %q", rootForward, after)
	}
}

// Not parallel: it checks every thread of the process, and other tests'
// dials hold threads in their worlds while they run.
func TestConcurrentDialsFromManyNamespaces(t *testing.T) {
	w := NewWorld(t, Options{Pods: 3})
	pods := w.Pods()
	var wg sync.WaitGroup
	errs := make(chan error, 300)
	for i := 0; i < 300; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			from := []string{w.Node(), w.Client(), pods[i%3].NS}[i%3]
			to := pods[(i/3)%3]
			network := []string{"tcp", "udp"}[i%2]
			port := map[string]int{"tcp": 8080, "udp": 5353}[network]
			reply, err := w.Dial(from, network, addr(to.IP, port), 5*time.Second)
			if name, _ := ParseReply(reply); err != nil || name != to.Name {
				errs <- fmt.Errorf("%s from %s to %s: %q, %v", network, from, to.Name, reply, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Every thread went back to the test process's own namespace (or died
	// with its goroutine): none is left where the runtime could reuse it.
	want, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, task := range tasks {
		got, err := os.Readlink("/proc/self/task/" + task.Name() + "/ns/net")
		if err == nil && got != want {
			t.Errorf("thread %s is left in %s, not %s", task.Name(), got, want)
		}
	}
}

func TestAddAndRemovePod(t *testing.T) {
	t.Parallel()
	w := NewWorld(t, Options{Pods: 1})
	p := w.AddPod()
	if p.Name != "pod-1" || w.Pod("pod-1") != p || len(w.Pods()) != 2 {
		t.Fatalf("added %+v; pods %d", p, len(w.Pods()))
	}
	if reply, err := w.Dial(w.Client(), "udp", addr(p.IP, 5354), 3*time.Second); err != nil || !strings.HasPrefix(reply, "pod-1 ") {
		t.Fatalf("new pod: %q, %v", reply, err)
	}
	pid := p.Echo.Pid()
	w.RemovePod(p)
	if _, err := os.Stat("/run/netns/" + p.NS); !os.IsNotExist(err) {
		t.Errorf("namespace %s still there after RemovePod", p.NS)
	}
	if syscall.Kill(pid, 0) == nil {
		t.Errorf("echo of removed pod still running (pid %d)", pid)
	}
	if len(w.Pods()) != 1 {
		t.Errorf("pods after remove: %d, want 1", len(w.Pods()))
	}
	if _, err := w.Dial(w.Node(), "tcp", addr(p.IP, 8080), 300*time.Millisecond); err == nil {
		t.Errorf("removed pod still answers")
	}
	if out, err := w.Exec(w.Node(), "ip", "link", "show", p.Veth); err == nil {
		t.Errorf("veth %s still in the node: %s", p.Veth, out)
	}
}

func TestProcessInNodeStopsAndRestarts(t *testing.T) {
	t.Parallel()
	w := NewWorld(t, Options{})
	echo, err := Build("./test/echo")
	if err != nil {
		t.Fatal(err)
	}
	p := w.StartInNode(t, echo, "-name", "in-node", "-listen", "127.0.0.1:9000")
	ask := func() string {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			reply, err := w.Dial(w.Node(), "tcp", "127.0.0.1:9000", time.Second)
			if err == nil {
				return reply
			}
			if time.Now().After(deadline) {
				t.Fatalf("echo in node does not answer: %v\n%s", err, p.Log())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if name, _ := ParseReply(ask()); name != "in-node" {
		t.Fatalf("reply from %q", name)
	}
	// The pid is the program's own: ip netns exec execs it in place.
	first := p.Pid()
	if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", first)); strings.TrimSpace(string(comm)) != "echo" {
		t.Errorf("pid %d is %q, not the echo server", first, comm)
	}
	if err := p.Restart(); err != nil {
		t.Fatal(err)
	}
	if p.Pid() == first || !p.Running() {
		t.Errorf("after restart: pid %d (was %d), running %v", p.Pid(), first, p.Running())
	}
	ask()
	if err := p.Stop(); err != nil {
		t.Errorf("stop: %v", err)
	}
	if p.Running() {
		t.Errorf("still running after Stop")
	}
	if log := p.Log(); strings.Count(log, "listening") != 2 {
		t.Errorf("log should hold both runs:\n%s", log)
	}
}

func TestNFTInNode(t *testing.T) {
	t.Parallel()
	Require(t, "nft")
	w := NewWorld(t, Options{})
	if _, err := w.NFT("add", "table", "ip", "harness-probe"); err != nil {
		t.Fatal(err)
	}
	out, err := w.NFT("list", "ruleset")
	if err != nil || !strings.Contains(out, "table ip harness-probe") {
		t.Fatalf("list ruleset in node: %q, %v", out, err)
	}
	// It was the node's ruleset, not the root namespace's.
	if root, _ := exec.Command("nft", "list", "tables").Output(); strings.Contains(string(root), "harness-probe") {
		t.Errorf("table leaked into the root namespace")
	}
	if _, err := w.NFT("list", "table", "ip", "no-such-table"); err == nil {
		t.Errorf("nft error not reported")
	}
}

// fakeTB is a test whose cleanups we run ourselves, to check that a world is
// removed even when its test failed.
type fakeTB struct {
	testing.TB
	mu       sync.Mutex
	cleanups []func()
	failed   bool
}

func (f *fakeTB) Cleanup(fn func())   { f.mu.Lock(); f.cleanups = append(f.cleanups, fn); f.mu.Unlock() }
func (f *fakeTB) Failed() bool        { f.mu.Lock(); defer f.mu.Unlock(); return f.failed }
func (f *fakeTB) Fail()               { f.mu.Lock(); f.failed = true; f.mu.Unlock() }
func (f *fakeTB) Logf(string, ...any) {}
func (f *fakeTB) Errorf(format string, args ...any) {
	f.Fail()
	f.TB.Logf("world reported: "+format, args...)
}
func (f *fakeTB) runCleanups() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}

func TestCleanupRemovesEverythingEvenOnFailure(t *testing.T) {
	t.Parallel()
	Require(t)
	for _, fail := range []bool{false, true} {
		ft := &fakeTB{TB: t}
		w := NewWorld(ft, Options{Pods: 2})
		p := w.StartInNode(ft, w.echo, "-name", "x", "-udp", "127.0.0.1:9999")
		nss := w.Namespaces()
		pids := []int{p.Pid()}
		for _, pod := range w.Pods() {
			pids = append(pids, pod.Echo.Pid())
		}
		if len(nss) != 4 {
			t.Fatalf("namespaces: %v", nss)
		}
		if fail {
			ft.Fail()
		}
		ft.runCleanups()

		list, err := exec.Command("ip", "netns", "list").Output()
		if err != nil {
			t.Fatal(err)
		}
		for _, ns := range nss {
			if strings.Contains(string(list), ns) {
				t.Errorf("failed=%v: namespace %s survived cleanup", fail, ns)
			}
		}
		for _, pid := range pids {
			if syscall.Kill(pid, 0) == nil {
				t.Errorf("failed=%v: process %d survived cleanup", fail, pid)
			}
		}
	}
}

func TestSweepStaleRemovesDeadRunsOnly(t *testing.T) {
	t.Parallel()
	Require(t)
	// A pid that is not running: its namespace is stale.
	dead := 0
	for pid := 4_000_000; pid > 1000; pid -= 7 {
		if syscall.Kill(pid, 0) == syscall.ESRCH {
			dead = pid
			break
		}
	}
	stale := fmt.Sprintf("%s%d-1-node", Prefix, dead)
	mine := fmt.Sprintf("%s%d-999999-node", Prefix, os.Getpid())
	for _, ns := range []string{stale, mine} {
		if err := ip("netns", "add", ns); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { deleteNS(ns) })
	}
	staleBin, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", binDirPrefix, dead))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(staleBin) })
	for _, err := range SweepStale() {
		t.Error(err)
	}
	if _, err := os.Stat("/run/netns/" + stale); !os.IsNotExist(err) {
		t.Errorf("stale namespace %s not swept", stale)
	}
	if _, err := os.Stat(staleBin); !os.IsNotExist(err) {
		t.Errorf("stale binaries folder %s not swept", staleBin)
	}
	if _, err := os.Stat("/run/netns/" + mine); err != nil {
		t.Errorf("live run's namespace %s swept: %v", mine, err)
	}
}

// TestPodsKeepReachingTheNodeWhenAPortWithALowerAddressJoins: the pod
// bridge has an address of its own. A bridge without one takes its lowest
// port's, so a port that joins later can change it under the pods that
// cached the old one; their packets then reach the node as another host's,
// and only DNATed ones are routed on (KF-14, docs/known-flakes.md).
func TestPodsKeepReachingTheNodeWhenAPortWithALowerAddressJoins(t *testing.T) {
	t.Parallel()
	w := NewWorld(t, Options{Pods: 2})
	node := w.Node()
	address := func(dev string) string {
		out, err := w.Exec(node, "cat", "/sys/class/net/"+dev+"/address")
		if err != nil {
			t.Fatalf("the address of %s: %v\n%s", dev, err, out)
		}
		return strings.TrimSpace(out)
	}
	bridge := func() string { return address(BridgeName) }
	// A pod whose port's address is not the bridge's: a bridge without an
	// address of its own has one of them, and a frame to the port it came
	// in on is the node's whatever the bridge's address.
	pod := w.Pods()[0]
	if address(pod.Veth) == bridge() {
		pod = w.Pods()[1]
	}
	forwarded := func() int {
		out, err := w.Exec(node, "nstat", "-asz", "IpForwDatagrams")
		if err != nil {
			t.Fatalf("nstat: %v\n%s", err, out)
		}
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "IpForwDatagrams" {
				n, _ := strconv.Atoi(f[1])
				return n
			}
		}
		t.Fatalf("nstat has no IpForwDatagrams:\n%s", out)
		return 0
	}
	before := bridge()
	for _, c := range [][]string{
		{"-n", node, "link", "add", "kplow", "address", "02:00:00:00:00:01", "type", "veth", "peer", "name", "kplowpeer"},
		{"-n", node, "link", "set", "kplow", "master", BridgeName},
		{"-n", node, "link", "set", "kplow", "up"},
	} {
		if err := IP(c...); err != nil {
			t.Fatal(err)
		}
	}
	if after := bridge(); after != before {
		t.Errorf("the bridge's address changed from %s to %s when a port with a lower one joined", before, after)
	}
	// The pod's packet to a Service address without a rule (not DNATed)
	// is still routed on, to the client.
	n := forwarded()
	_, _ = w.Dial(pod.NS, "tcp", "10.96.0.99:80", 300*time.Millisecond)
	if forwarded() == n {
		t.Errorf("the node forwarded nothing of the pod's connection to 10.96.0.99:80 after the new port joined")
	}
}
