package e2e

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kpproxy/kp/test/netns"
)

func TestMain(m *testing.M) { os.Exit(netns.Main(m)) }

// slow stretches a wait for the VM (KP_VM=1), where qemu emulates the CPU
// in software: every exec of iptables or ipset, every sync, takes several
// times as long as on the host.
func slow(d time.Duration) time.Duration {
	if os.Getenv("KP_VM") == "1" {
		return 4 * d
	}
	return d
}

// nodeName is kp's --hostname-override in every world.
const nodeName = "node"

// Addresses kp serves its health and metrics on, inside the node namespace
// (every world has its own, so the fixed ports never collide).
const (
	healthzAddr = "127.0.0.1:10256"
	metricsAddr = "127.0.0.1:10249"
)

// env is one test's world with kp running in it.
type env struct {
	t    *testing.T
	mode mode
	w    *netns.World
	dir  ManifestDir
	kp   *netns.Process
	// source is kp's source of Services: --manifests dir unless a test
	// points kp at an API server instead.
	source []string
	// socket is kp's --status-socket: its status API, root's only.
	socket string
	// traceRecord is what the last trace saw besides its path, printed
	// when the path differs (iptables-legacy's counters, KF-14).
	traceRecord string
}

// newEnv builds a world with pods and a manifests folder holding the node's
// own Node object, for kp in mode m. It skips the test unless root, or when
// KP_E2E_MODES leaves m out; it fails if kp does not build. The test runs
// in parallel with others.
func newEnv(t *testing.T, m mode, pods int) *env {
	t.Helper()
	netns.Require(t)
	skipUnselected(t, m)
	t.Parallel()
	return newEnvSerial(t, m, pods)
}

// newEnvSerial is newEnv for a test that must not run in parallel.
func newEnvSerial(t *testing.T, m mode, pods int) *env {
	t.Helper()
	netns.Require(t)
	skipUnselected(t, m)
	if m.ipvs {
		requireIPVS(t)
		netns.Require(t, "ipvsadm", "ipset")
	}
	if m.rulesInIPTables() || m.ipvs {
		netns.Require(t, m.save("ip"), m.save("ip6"))
	}
	if _, err := netns.Build("./cmd/kp"); err != nil {
		t.Fatalf("kp does not build: %v", err)
	}
	w := netns.NewWorld(t, netns.Options{Pods: pods})
	e := &env{t: t, mode: m, w: w, dir: ManifestDir(t.TempDir()), socket: statusSocket(t)}
	e.write("node.yaml", Node(nodeName,
		[]string{w.NodeIP().String(), w.NodeIP6().String()},
		[]string{w.PodCIDR().String(), w.PodCIDR6().String()}))
	return e
}

// kpArgs is how every test runs kp: upstream kube-proxy's flags plus its
// source (kp's --manifests, or --kubeconfig) and its mode's flags.
func (e *env) kpArgs(extra ...string) []string {
	source := e.source
	if source == nil {
		source = []string{"--manifests", string(e.dir)}
	}
	args := append([]string{"proxy"}, source...)
	args = append(args, e.mode.args...)
	args = append(args,
		"--hostname-override", nodeName,
		"--cluster-cidr", e.w.ClusterCIDR(),
		"--healthz-bind-address", healthzAddr,
		"--metrics-bind-address", metricsAddr,
		"--status-socket", e.socket,
		"--min-sync-period", "100ms",
		// The node is a network namespace, where only the initial one may
		// set nf_conntrack_max (upstream's test harnesses pass the same).
		"--conntrack-max-per-core", "0",
		"-v", "2",
	)
	return append(args, extra...)
}

// statusSocket is a path for kp's status socket in a fresh directory,
// short enough for a socket's address (108 bytes, where t.TempDir's test
// names do not fit); kp makes its directory. The parent is open to every
// user (0755, as /run), so that only what kp sets refuses another user.
func statusSocket(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kpe2e")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "run", "kp.sock")
}

// startKP starts kp in the node namespace and waits until it is healthy.
func (e *env) startKP(extra ...string) {
	e.t.Helper()
	e.launchKP(extra...)
	e.waitHealthy()
}

// launchKP starts kp in the node namespace without waiting for it.
func (e *env) launchKP(extra ...string) {
	e.t.Helper()
	kp, err := netns.Build("./cmd/kp")
	if err != nil {
		e.t.Fatalf("kp does not build: %v", err)
	}
	e.kp = e.w.StartInNode(e.t, kp, e.kpArgs(extra...)...)
}

// waitHealthy polls kp's /healthz from inside the node namespace until it
// says 200 (kp has synced), failing early if kp exits.
func (e *env) waitHealthy() {
	e.t.Helper()
	err := e.kp.WaitHTTP("http://"+healthzAddr+"/healthz", slow(30*time.Second), func(code int, _ string) bool { return code == 200 })
	if err != nil {
		e.t.Fatalf("kp not healthy: %v", err)
	}
}

// write replaces a manifest file, failing the test on error.
func (e *env) write(file string, objs ...any) {
	e.t.Helper()
	if err := e.dir.Write(file, objs...); err != nil {
		e.t.Fatal(err)
	}
}

// eventually polls cond every 50 ms until it returns nil, failing the test
// with cond's last error after timeout.
func (e *env) eventually(what string, timeout time.Duration, cond func() error) {
	e.t.Helper()
	timeout = slow(timeout)
	start := time.Now()
	deadline := start.Add(timeout)
	for {
		err := cond()
		if err == nil {
			e.t.Logf("%s: after %v", what, time.Since(start).Round(time.Millisecond))
			return
		}
		if e.kp != nil && !e.kp.Running() {
			e.t.Fatalf("%s: kp exited (%v); last: %v", what, e.kp.ExitErr(), err)
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: not within %v: %v", what, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ask sends one request from namespace ns and returns the name of the pod
// that answered.
func (e *env) ask(ns, network, addr string) (string, error) {
	reply, err := e.w.Dial(ns, network, addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	name, _ := netns.ParseReply(reply)
	return name, nil
}

// answers waits until addr answers from ns, from one of want if given.
func (e *env) answers(ns, network, addr string, want ...string) {
	e.t.Helper()
	e.eventually(fmt.Sprintf("%s %s answers from %s", network, addr, ns), 15*time.Second, func() error {
		name, err := e.ask(ns, network, addr)
		if err != nil {
			return err
		}
		if len(want) > 0 && !contains(want, name) {
			return fmt.Errorf("answered by %s, want one of %v", name, want)
		}
		return nil
	})
}

// tally makes n requests from ns to addr and counts the answers per pod,
// and apart from them the failed requests per error: a failure is never
// counted as an answer, so no check of the answers (how many pods, which
// ones) can pass on requests that all failed. Only a test that expects
// some requests to fail (refused, say) reads failed itself; every other
// test asks through answered or spread, which treat any failure as one.
func (e *env) tally(ns, network, addr string, n int) (answers, failed map[string]int) {
	answers, failed = map[string]int{}, map[string]int{}
	for i := 0; i < n; i++ {
		name, err := e.ask(ns, network, addr)
		if err != nil {
			failed[failure(err)]++
			continue
		}
		answers[name]++
	}
	return answers, failed
}

// failure names how a request failed, without the client's port (each
// request has its own), so that failures of one kind count together.
func failure(err error) string {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err.Error()
	}
	return err.Error()
}

// answered makes n requests and counts the answers per pod; any failed
// request is an error that says how many failed and how. It is for a poll
// (eventually), where a failure may mean "not yet".
func (e *env) answered(ns, network, addr string, n int) (map[string]int, error) {
	answers, failed := e.tally(ns, network, addr, n)
	if len(failed) > 0 {
		return answers, fmt.Errorf("%s %s from %s: %d of %d requests failed (%s); answers %v",
			network, addr, ns, n-total(answers), n, strings.Join(counted(failed), ", "), answers)
	}
	return answers, nil
}

// spread makes n requests and counts the answers per pod. Any failed
// request fails t at once: the counts are only a proof about endpoints
// when every request was answered.
func (e *env) spread(t *testing.T, ns, network, addr string, n int) map[string]int {
	t.Helper()
	answers, err := e.answered(ns, network, addr, n)
	if err != nil {
		t.Fatal(err)
	}
	return answers
}

// total sums counts.
func total(counts map[string]int) int {
	n := 0
	for _, k := range counts {
		n += k
	}
	return n
}

// counted lists counts as "key ×n", sorted, for messages.
func counted(counts map[string]int) []string {
	var out []string
	for k, v := range counts {
		out = append(out, fmt.Sprintf("%s ×%d", k, v))
	}
	slices.Sort(out)
	return out
}

func (e *env) podNames(pods ...*netns.Pod) []string {
	var names []string
	for _, p := range pods {
		names = append(names, p.Name)
	}
	return names
}

// endpoints lists pods as ready endpoints on this node, IPv4 and IPv6.
func endpoints(pods ...*netns.Pod) []Endpoint {
	var eps []Endpoint
	for _, p := range pods {
		eps = append(eps, Endpoint{IP: p.IP.String(), NodeName: nodeName})
	}
	for _, p := range pods {
		eps = append(eps, Endpoint{IP: p.IP6.String(), NodeName: nodeName})
	}
	return eps
}

func hostPort(ip string, port int) string {
	return netip.AddrPortFrom(netip.MustParseAddr(ip), uint16(port)).String()
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// chiSquare is Pearson's statistic for counts over names against an even
// spread. With k names it has k-1 degrees of freedom.
func chiSquare(counts map[string]int, names []string) float64 {
	total := 0
	for _, n := range names {
		total += counts[n]
	}
	expected := float64(total) / float64(len(names))
	var x2 float64
	for _, n := range names {
		d := float64(counts[n]) - expected
		x2 += d * d / expected
	}
	return x2
}

// chiSquareCritical001 is the chi-square value a fair spread exceeds with
// probability 0.001, by degrees of freedom: the test flakes once in a
// thousand runs at most, and still catches a spread that favours one
// endpoint by a third.
var chiSquareCritical001 = map[int]float64{1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467}

func isRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}
