package cluster

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpproxy/kp/test/images"
	"github.com/kpproxy/kp/test/netns"
)

func TestMain(m *testing.M) { os.Exit(netns.Main(m)) }

// fakeTB is a test whose cleanups we run ourselves, to check that a cluster
// is removed even when its test failed.
type fakeTB struct {
	testing.TB
	mu       sync.Mutex
	cleanups []func()
	failed   bool
}

func (f *fakeTB) Cleanup(fn func()) { f.mu.Lock(); f.cleanups = append(f.cleanups, fn); f.mu.Unlock() }
func (f *fakeTB) Failed() bool      { f.mu.Lock(); defer f.mu.Unlock(); return f.failed }
func (f *fakeTB) Fail()             { f.mu.Lock(); f.failed = true; f.mu.Unlock() }
func (f *fakeTB) Errorf(format string, args ...any) {
	f.Fail()
	f.TB.Errorf("cluster reported: "+format, args...)
}
func (f *fakeTB) runCleanups() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}

func readSysctls(t *testing.T) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, k := range kubeletSysctls {
		b, err := os.ReadFile(sysctlPath(k))
		if err != nil {
			t.Fatal(err)
		}
		m[k] = strings.TrimSpace(string(b))
	}
	return m
}

func TestAPodRunsAndNothingOfTheClusterSurvivesAFailedTest(t *testing.T) {
	netns.Require(t)
	// A killed run's leftovers first, or the kernel settings it left
	// rewritten would be taken for this machine's own.
	sweepOnce.Do(func() {
		for _, err := range SweepStale() {
			t.Logf("sweep stale clusters: %v", err)
		}
	})
	// The machine's own values, unless another test process's kubelets
	// rewrote them already: then that process's record has them.
	before := otherProcessSysctls()
	if before == nil {
		before = readSysctls(t)
	}
	ft := &fakeTB{TB: t}
	defer ft.runCleanups() // if the test itself dies half-way
	c := Start(ft, Options{Nodes: 1})
	n := c.Nodes[0]
	manifest := filepath.Join(t.TempDir(), "pod.yaml")
	if err := os.WriteFile(manifest, []byte(`apiVersion: v1
kind: Pod
metadata:
  name: sleeper
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: pause
      image: `+images.Get(t, images.Pause).Ref+`
      imagePullPolicy: Never
`), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := c.Kubectl("apply", "-f", manifest); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		p, err := c.Client().CoreV1().Pods("default").Get(t.Context(), "sleeper", metav1.GetOptions{})
		if err == nil && p.Status.Phase == "Running" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod sleeper not running after 2 minutes: %v %+v\n%s", err, p.Status, c.Dump())
		}
		time.Sleep(250 * time.Millisecond)
	}
	if after := readSysctls(t); after["vm.overcommit_memory"] != "1" {
		t.Logf("the kubelet did not rewrite vm.overcommit_memory (%v): the restore below proves less", after)
	}
	pids := cgroupPids(n.CgroupRoot())
	if len(pids) < 4 { // kubelet, containerd, a shim, two pause processes
		t.Errorf("only %d processes in the node's cgroup %s: %v", len(pids), n.CgroupRoot(), pids)
	}
	socks := shimSockets(n.NS)
	if len(socks) == 0 {
		t.Errorf("no shim socket found for %s", n.Name)
	}
	netnsFiles, _ := filepath.Glob(filepath.Join(n.criStateDir(), "netns", "*"))
	if len(netnsFiles) == 0 {
		t.Errorf("no pod network namespace under %s", n.criStateDir())
	}

	ft.Fail()
	ft.runCleanups()
	ft.cleanups = nil

	for _, pid := range pids {
		if running(pid) {
			t.Errorf("process %d of the node survived", pid)
		}
	}
	mounts, _ := cgroupMounts()
	for _, m := range mounts {
		if _, err := os.Stat(filepath.Join(m, n.NS)); err == nil {
			t.Errorf("cgroup %s survived", filepath.Join(m, n.NS))
		}
	}
	if _, err := os.Stat(n.Dir); err == nil {
		t.Errorf("node folder %s survived", n.Dir)
	}
	if left, _ := mountsUnder(n.Dir); len(left) > 0 {
		t.Errorf("mounts survived: %v", left)
	}
	for _, s := range socks {
		if _, err := os.Stat(s); err == nil {
			t.Errorf("shim socket %s survived", s)
		}
	}
	list, _ := exec.Command("ip", "netns", "list").Output()
	for _, ns := range []string{n.NS, c.API.NS()} {
		if strings.Contains(string(list), ns) {
			t.Errorf("namespace %s survived", ns)
		}
	}
	// Restored: the last cluster's cleanup wrote the machine's values
	// from this process's record and removed it, whoever else runs
	// clusters; and the live values are the machine's unless another test
	// process's kubelets rewrote them since (it restores them when done).
	checkRestored(t, sysctlsFile(os.Getpid()), before)
	// Nor anything at the paths the kubelet, the shims and libcni fix.
	if otherProcessSysctls() == nil {
		for _, d := range sharedDirs {
			if _, err := os.Lstat(d); err == nil {
				t.Errorf("%s survived the last cluster", d)
			}
		}
	}
	for _, d := range []string{"/usr/libexec/kubernetes/kubelet-plugins", "/etc/cni/net.d", "/var/log/pods"} {
		if _, err := os.Lstat(d); err == nil {
			t.Logf("%s exists (a kubelet or CNI default path the harness should not use)", d)
		}
	}
}

func equal(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// running reports whether pid is a live process: not gone, and not a
// zombie that has died but waits for its parent (a shim's children are
// reparented when the shim dies, and reaped a moment later) to reap it.
func running(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	// "pid (comm) S ...": the state follows the last ')'.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// checkRestored fails t unless the last restore wrote want from the
// record file and removed it (keyed to the test's own record, so another
// test process's clusters do not switch the check off), and, when no other
// test process holds a record, unless the live settings are want.
func checkRestored(t *testing.T, file string, want map[string]string) {
	t.Helper()
	if wrote, ok := restoredFrom(file); !ok {
		t.Errorf("kernel settings not restored from %s (the last restore was not from it)", file)
	} else if !equal(wrote, want) {
		t.Errorf("kernel settings restored from %s: %v, want the machine's %v", file, wrote, want)
	}
	if _, err := os.Stat(file); err == nil {
		t.Errorf("the settings' record %s survived its restore", file)
	}
	if after := readSysctls(t); otherProcessSysctls() == nil && !equal(want, after) {
		t.Errorf("kernel settings not restored: before %v, after %v", want, after)
	}
}
