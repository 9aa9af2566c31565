package conformance

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/test/apiserver"
	"github.com/kpproxy/kp/test/cluster"
	"github.com/kpproxy/kp/test/image"
	"github.com/kpproxy/kp/test/netns"
)

func TestMain(m *testing.M) { os.Exit(netns.Main(m)) }

// focus chooses upstream's tests: those of sig-network that a node proxy
// decides (Services, KubeProxy, Conntrack, the Networking granular checks,
// topology, traffic distribution, Service CIDRs), and every sig-network
// conformance test.
const focus = `\[sig-network\] (Services|KubeProxy|Conntrack|Networking|Topology|Traffic Distribution|Service CIDRs|ServiceCIDR)|` +
	`\[sig-network\].*\[Conformance\]`

// skips are what cannot exist on this machine's clusters, each with why.
// A test that passes with upstream kube-proxy and fails with kp is a kp bug,
// never a new line here.
var skips = []SkipRule{
	{Pattern: `\[Disruptive\]`, Reason: "restarts or breaks cluster components (kube-proxy, the API server, nodes) " +
		"through the cloud provider or ssh, which this cluster has not; the harness runs them as plain processes"},
	{Pattern: `\[Slow\]`, Reason: "minutes each; upstream's CI runs them in a job of their own"},
	{Pattern: `\[Flaky\]`, Reason: "upstream marks them unreliable and keeps them out of its own jobs"},
	{Pattern: `\[Feature:`, Reason: "feature gates or capabilities off on this cluster, cloud load balancers " +
		"([Feature:LoadBalancer]) among them"},
	{Pattern: `SCTP`, Reason: "this machine's kernel has no SCTP sockets (socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP) " +
		"fails with EPROTONOSUPPORT, and it loads no modules); the test also enters the machine's own mount " +
		"namespace from a privileged hostPID pod"},
}

// nodes is the cluster's size: tests that spread pods over nodes, or
// reach a NodePort on a node without endpoints, want at least 3.
const nodes = 3

// procs is ginkgo's number of parallel test processes.
const procs = 4

// mode is one column of the report: what programs the nodes.
type mode struct {
	name  string
	proxy string
	// deploy starts the node proxy on every node of c and waits until it
	// serves its health check.
	deploy func(t *testing.T, c *cluster.Cluster, out string)
}

var modes = []mode{
	{name: "upstream-nftables", proxy: "kube-proxy v1.36.3 --proxy-mode=nftables, a process per node", deploy: startKubeProxy("nftables")},
	{name: "kp-nftables", proxy: "mode nftables, the DaemonSet of manifests/", deploy: deployKP("nftables")},
	{name: "upstream-iptables", proxy: "kube-proxy v1.36.3 --proxy-mode=iptables (iptables-nft, Debian's default), a process per node",
		deploy: startKubeProxy("iptables")},
	{name: "kp-iptables", proxy: "mode iptables (backend chosen as iptables-wrapper does), the DaemonSet of manifests/ with mode: iptables",
		deploy: deployKP("iptables")},
	// Upstream has no userspace mode any more: the column answers to
	// upstream-nftables (Baseline); the mode's known limits (the client's
	// address is not preserved, SCTP not proxied) explain what it fails.
	{name: "kp-userspace", proxy: "mode userspace (nftables redirects to a listener per service port), the DaemonSet of manifests/ with mode: userspace",
		deploy: deployKP("userspace")},
}

// TestConformance runs upstream's Services tests once per mode (each on a
// fresh cluster of 3 nodes) and writes REPORT.md and results.json next to
// this file. KP_CONFORMANCE=1 runs it; KP_CONFORMANCE_MODES=a,b runs only
// those columns (the others' results stay in the report);
// KP_CONFORMANCE_FOCUS narrows the tests further (a regular expression,
// for debugging one test: its run is not written to the report);
// KP_CONFORMANCE_RENDER=1 only writes REPORT.md again from results.json;
// KP_CONFORMANCE_MERGE=why with KP_CONFORMANCE_FOCUS puts the focused
// tests' new results into their column, noting why they were rerun.
func TestConformance(t *testing.T) {
	if os.Getenv("KP_CONFORMANCE") != "1" {
		t.Skip("skipped: upstream's Services tests take tens of minutes; make conformance runs them (KP_CONFORMANCE=1)")
	}
	art := cached(t)
	root, err := netns.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	here := filepath.Join(root, "test", "conformance")
	results, err := Load(filepath.Join(here, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	results.Focus, results.Skips = focus, skips
	if os.Getenv("KP_CONFORMANCE_RENDER") == "1" {
		// Only REPORT.md again, from results.json (after a change of its
		// layout).
		if err := results.Write(filepath.Join(here, "results.json"), filepath.Join(here, "REPORT.md")); err != nil {
			t.Fatal(err)
		}
		return
	}
	want := map[string]bool{}
	for _, m := range strings.Split(os.Getenv("KP_CONFORMANCE_MODES"), ",") {
		if m != "" {
			want[m] = true
		}
	}
	debugFocus := os.Getenv("KP_CONFORMANCE_FOCUS")
	commit, err := cleanCommit(root)
	if err != nil {
		t.Fatal(err)
	}
	if err := results.StartAt(commit, len(want) == 0 && debugFocus == ""); err != nil {
		t.Fatal(err)
	}
	for _, m := range modes {
		if len(want) > 0 && !want[m.name] {
			continue
		}
		t.Run(m.name, func(t *testing.T) {
			out := filepath.Join(root, "bin", "conformance", m.name)
			if err := os.RemoveAll(out); err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(out, 0o755); err != nil {
				t.Fatal(err)
			}
			run, tests := runMode(t, m, art, out, debugFocus, root, commit)
			if debugFocus != "" {
				note := os.Getenv("KP_CONFORMANCE_MERGE")
				if note == "" {
					t.Logf("KP_CONFORMANCE_FOCUS set: the report is not rewritten")
					return
				}
				var names []string
				for name, res := range tests {
					names = append(names, fmt.Sprintf("%s (%s)", name, res.State))
				}
				sort.Strings(names)
				note = fmt.Sprintf("%s, %d tests (%s): %s", run.Started.UTC().Format("2006-01-02 15:04 UTC"), len(tests),
					strings.Join(names, "; "), note)
				if err := results.Merge(m.name, tests, note); err != nil {
					t.Fatal(err)
				}
				if err := results.Write(filepath.Join(here, "results.json"), filepath.Join(here, "REPORT.md")); err != nil {
					t.Fatal(err)
				}
				return
			}
			results.Set(run, tests)
			if err := results.Write(filepath.Join(here, "results.json"), filepath.Join(here, "REPORT.md")); err != nil {
				t.Fatal(err)
			}
			totals := map[string]int{}
			for _, res := range tests {
				totals[res.State]++
			}
			t.Logf("%s: %d passed, %d failed, %d skipped; report in %s, logs in %s", m.name,
				totals[Passed], totals[Failed], totals[Skipped], here, out)
		})
	}
	for col, names := range results.Regressions() {
		t.Errorf("%s: %d tests pass with upstream kube-proxy and not here:\n  %s", col, len(names), strings.Join(names, "\n  "))
	}
}

// runMode brings a cluster up with m's proxy and the cluster DNS, runs the
// tests against it with ginkgo, keeps the logs in out and returns the
// column.
func runMode(t *testing.T, m mode, art artifacts, out, debugFocus, root, commit string) (Run, map[string]Result) {
	start := time.Now()
	var imgs []image.Image
	if strings.HasPrefix(m.name, "kp-") {
		kpBin, err := netns.BuildStatic("./cmd/kp")
		if err != nil {
			t.Fatal(err)
		}
		img, err := image.KP(kpBin, kpImage)
		if err != nil {
			t.Fatal(err)
		}
		imgs = append(imgs, img)
	}
	c := cluster.Start(t, cluster.Options{Nodes: nodes, Images: imgs})
	for _, tarball := range art.tarballs {
		for _, n := range c.Nodes {
			if err := n.ImportImages(tarball); err != nil {
				t.Fatal(err)
			}
		}
	}
	m.deploy(t, c, out)
	// Two replicas, spread over the nodes, as kubeadm deploys it.
	cluster.DeployDNS(t, c, cluster.DNSOptions{Replicas: 2})
	setup := time.Since(start)
	t.Logf("%s: cluster, proxy and DNS up in %v", m.name, setup.Round(time.Second))

	f := focus
	if debugFocus != "" {
		f = debugFocus
	}
	started := time.Now()
	report := runGinkgo(t, c, art, f, out)
	t.Cleanup(func() { dumpNodes(t, c, out) })
	tests, seconds, suiteFailure, err := ParseGinkgo(report, f, skips)
	if err != nil {
		t.Fatal(err)
	}
	if suiteFailure != "" {
		t.Errorf("%s: the suite's setup or teardown failed:\n%s", m.name, suiteFailure)
	}
	proxy := m.proxy
	if strings.HasPrefix(m.name, "kp-") {
		proxy = fmt.Sprintf("kp %s: %s", buildLabel(root, commit), m.proxy)
	}
	run := Run{
		Mode:  m.name,
		Proxy: proxy,
		Cluster: fmt.Sprintf("%d nodes; kube-apiserver, kube-controller-manager, kube-scheduler, kubelet v1.36.3; "+
			"containerd %s, runc, bridge CNI; CoreDNS v1.15.0 as kube-dns (%s); host kernel %s",
			nodes, containerdVersion(), cluster.ClusterDNS, kernel()),
		Ginkgo:       fmt.Sprintf("e2e.test v1.36.3 under ginkgo v2.28.1, %d parallel processes, --provider=skeleton", procs),
		Started:      started,
		Seconds:      seconds,
		SetupSeconds: setup.Seconds(),
		SuiteFailure: suiteFailure,
	}
	return run, tests
}

// runGinkgo runs e2e.test under ginkgo in the API server's network
// namespace (which reaches the API server, the kubelets and every pod, and
// nothing beyond), with the built kubectl first on PATH, and returns the
// JSON report's path. Ginkgo's output goes to out/ginkgo.log.
func runGinkgo(t *testing.T, c *cluster.Cluster, art artifacts, focus, out string) string {
	kubectl := apiserver.Bin(t, apiserver.Kubectl)
	kubeconfig := c.API.Kubeconfig(0, c.API.AdminToken())
	report := filepath.Join(out, "report.json")
	args := []string{"--net=/run/netns/" + c.API.NS(), "--", art.ginkgo,
		"--procs", fmt.Sprint(procs),
		"--focus", focus,
		"--skip", skipPattern(),
		"--timeout", "90m",
		"--no-color",
		"--poll-progress-after", "5m",
		"--output-dir", out,
		"--json-report", "report.json",
		"--junit-report", "junit.xml",
		art.e2eTest, "--",
		"--kubeconfig", kubeconfig,
		"--provider", "skeleton",
		"--kubectl-path", kubectl,
		"--dump-logs-on-failure=false",
		"--allowed-not-ready-nodes", "0",
		"--node-os-distro", "debian",
		// Only ginkgo's first process counts the nodes by itself; the
		// others would skip the tests that want at least 2.
		"--num-nodes", fmt.Sprint(nodes),
		"--report-dir", out,
	}
	log, err := os.Create(filepath.Join(out, "ginkgo.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command("nsenter", args...)
	cmd.Dir = out
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(kubectl)+":"+os.Getenv("PATH"), "KUBECONFIG="+kubeconfig)
	start := time.Now()
	t.Logf("ginkgo: %d processes, focus %s; log in %s", procs, focus, log.Name())
	err = cmd.Run()
	t.Logf("ginkgo ended after %v: %v", time.Since(start).Round(time.Second), err)
	if _, statErr := os.Stat(report); statErr != nil {
		b, _ := os.ReadFile(log.Name())
		t.Fatalf("ginkgo wrote no report (%v): %v\n%s", err, statErr, tailLines(string(b), 60))
	}
	return report
}

func skipPattern() string {
	var ps []string
	for _, s := range skips {
		ps = append(ps, s.Pattern)
	}
	return strings.Join(ps, "|")
}

// dumpNodes keeps, in out, what a failing test's cause is looked for in:
// each node's ruleset and every kube-system pod's log.
func dumpNodes(t *testing.T, c *cluster.Cluster, out string) {
	for _, n := range c.Nodes {
		rules, err := n.Exec("nft", "list", "ruleset")
		if err != nil {
			rules += fmt.Sprintf("\n(%v)\n", err)
		}
		_ = os.WriteFile(filepath.Join(out, n.Name+".nft"), []byte(rules), 0o644)
	}
	pods, _ := c.Kubectl("get", "pods", "-n", "kube-system", "-o", "name")
	for _, p := range strings.Fields(pods) {
		logs, _ := c.Kubectl("logs", "-n", "kube-system", p)
		_ = os.WriteFile(filepath.Join(out, strings.ReplaceAll(p, "/", "-")+".log"), []byte(logs), 0o644)
	}
}

func containerdVersion() string {
	out, err := exec.Command("containerd", "--version").Output()
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(out))
	if len(f) >= 3 {
		return f[2]
	}
	return strings.TrimSpace(string(out))
}

func kernel() string {
	out, err := exec.Command("uname", "-r").Output()
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(out))
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// cleanCommit is the commit the run measures: the tree must hold no
// uncommitted change to a tracked file, since the report names one commit
// and kp's columns run its build.
func cleanCommit(root string) (string, error) {
	cmd := exec.Command("git", "status", "--porcelain", "--untracked-files=no")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git status: %w", err)
	}
	if len(strings.TrimSpace(string(out))) > 0 {
		return "", fmt.Errorf("the tree has uncommitted changes; the report names one commit, so make conformance runs from a clean tree:\n%s", out)
	}
	cmd = exec.Command("git", "describe", "--always")
	cmd.Dir = root
	out, err = cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git describe: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}
