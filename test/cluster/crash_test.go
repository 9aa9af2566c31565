package cluster

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpproxy/kp/test/images"
	"github.com/kpproxy/kp/test/netns"
)

// crashHelperEnv makes TestCrashHelper run: it is the test process that
// TestSweepRemovesAKilledRunsCluster kills.
const crashHelperEnv = "KP_CLUSTER_CRASH_HELPER"

// TestCrashHelper is not a test of its own: run by
// TestSweepRemovesAKilledRunsCluster as a child process, it brings up a
// one-node cluster with a running pod, says so, and waits to be killed.
func TestCrashHelper(t *testing.T) {
	if os.Getenv(crashHelperEnv) == "" {
		t.Skip("a helper process of TestSweepRemovesAKilledRunsCluster")
	}
	c := Start(t, Options{Nodes: 1})
	manifest := filepath.Join(t.TempDir(), "pod.yaml")
	if err := os.WriteFile(manifest, []byte("apiVersion: v1\nkind: Pod\nmetadata:\n  name: sleeper\nspec:\n"+
		"  containers:\n    - name: pause\n      image: "+images.Get(t, images.Pause).Ref+"\n      imagePullPolicy: Never\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := c.Kubectl("apply", "-f", manifest); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(250 * time.Millisecond) {
		p, err := c.Client().CoreV1().Pods("default").Get(t.Context(), "sleeper", metav1.GetOptions{})
		if err == nil && p.Status.Phase == "Running" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod sleeper not running: %v", err)
		}
	}
	fmt.Printf("CLUSTER-READY %s %s\n", c.Nodes[0].NS, c.API.NS())
	time.Sleep(10 * time.Minute)
}

// helperSkipped reports whether TestCrashHelper's verbose output says it
// skipped: its own --- SKIP line, not a log line (the kubelet's,
// containerd's) that happens to hold the word.
func helperSkipped(out string) bool {
	return regexp.MustCompile(`(?m)^--- SKIP: TestCrashHelper \(`).MatchString(out)
}

func TestSweepRemovesAKilledRunsCluster(t *testing.T) {
	netns.Require(t, "nsenter", "containerd", "ctr", "runc")
	sweepOnce.Do(func() {
		for _, err := range SweepStale() {
			t.Logf("sweep stale clusters: %v", err)
		}
	})
	before := otherProcessSysctls()
	if before == nil {
		before = readSysctls(t)
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestCrashHelper$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), crashHelperEnv+"=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	var nodeNS, apiNS string
	var out strings.Builder
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	timeout := time.After(4 * time.Minute)
wait:
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				_ = cmd.Wait()
				if helperSkipped(out.String()) {
					netns.Unavailable(t, "skipped: the helper skipped:\n%s", out.String())
				}
				t.Fatalf("the helper ended before its cluster was up:\n%s", out.String())
			}
			out.WriteString(l + "\n")
			if f := strings.Fields(l); len(f) == 3 && f[0] == "CLUSTER-READY" {
				nodeNS, apiNS = f[1], f[2]
				break wait
			}
		case <-timeout:
			t.Fatalf("the helper's cluster not up after 4 minutes:\n%s", out.String())
		}
	}
	go func() {
		for range lines { // drain, so the helper never blocks writing
		}
	}()

	// Its shims' sockets, while its node's namespace still shows them.
	socks := shimSockets(nodeNS)
	if len(socks) == 0 {
		t.Errorf("no shim socket found for the killed run's node %s", nodeNS)
	}
	// Killed as a crashing test run is: no cleanup runs. Its kubelet and
	// containerd die with it (Pdeathsig); its shims and containers do not.
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	killed = true
	time.Sleep(time.Second)
	rel := "/" + nodeNS
	dir := filepath.Join(stateRoot, nodeNS)
	if len(cgroupPids(rel)) == 0 {
		t.Errorf("no process of the killed run's node left: nothing for the sweep to do")
	}
	if _, err := os.Stat(dir); err != nil {
		t.Errorf("the killed run's node folder is gone already: %v", err)
	}

	for _, err := range SweepStale() {
		t.Errorf("sweep: %v", err)
	}
	for _, err := range netns.SweepStale() {
		t.Errorf("sweep namespaces: %v", err)
	}
	if pids := cgroupPids(rel); len(pids) > 0 {
		t.Errorf("processes of the killed run's node survived the sweep: %v", pids)
	}
	if _, err := os.Stat(dir); err == nil {
		t.Errorf("node folder %s survived the sweep", dir)
	}
	if left, _ := mountsUnder(dir); len(left) > 0 {
		t.Errorf("mounts survived the sweep: %v", left)
	}
	mounts, _ := cgroupMounts()
	for _, m := range mounts {
		if _, err := os.Stat(filepath.Join(m, nodeNS)); err == nil {
			t.Errorf("cgroup %s survived the sweep", filepath.Join(m, nodeNS))
		}
	}
	for _, ns := range []string{nodeNS, apiNS} {
		if _, err := os.Stat(filepath.Join("/run/netns", ns)); err == nil {
			t.Errorf("namespace %s survived the sweep", ns)
		}
	}
	// The sweep restored the killed run's own record (keyed to its pid,
	// so another test process's clusters do not switch the check off).
	checkRestored(t, sysctlsFile(cmd.Process.Pid), before)
	for _, s := range socks {
		if _, err := os.Stat(s); err == nil {
			t.Errorf("shim socket %s of the killed run survived the sweep", s)
		}
	}
}

// The crash helper counts as skipped by its --- SKIP line only: a log line
// of its cluster holding "SKIP" is not a skip (it used to turn a helper
// that died before its cluster was up into a skip).
func TestCrashHelperSkipIsReadFromItsSkipLineOnly(t *testing.T) {
	for _, tc := range []struct {
		name string
		out  string
		want bool
	}{
		{"its skip line", "=== RUN   TestCrashHelper\n    crash_test.go:35: skipped: needs root\n--- SKIP: TestCrashHelper (0.00s)\nPASS\n", true},
		{"a log line with SKIP", "=== RUN   TestCrashHelper\nI1127 kubelet.go:10] SKIP_NODE_CHECKS=1\n    cluster.go:99: kubelet exited: exit status 1\n--- FAIL: TestCrashHelper (3.00s)\nFAIL\n", false},
		{"another test's skip line", "--- SKIP: TestCrashHelperToo (0.00s)\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := helperSkipped(tc.out); got != tc.want {
				t.Errorf("helperSkipped = %v, want %v", got, tc.want)
			}
		})
	}
}
