package netns

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"
)

var namespaces atomic.Int64

// NewNamespace creates a namespace of its own, outside any world, with lo
// up, and deletes it (killing what still runs in it) when t ends. Its name is
// kpt-PID-ROLEN, so SweepStale removes it if the test process is killed.
// Other packages' helpers use it for what is not a node, pod or client: the
// test API server lives in one.
func NewNamespace(t testing.TB, role string) string {
	t.Helper()
	Require(t)
	sweepOnce.Do(func() {
		for _, err := range SweepStale() {
			t.Logf("sweep stale namespaces: %v", err)
		}
	})
	name := fmt.Sprintf("%s%d-%s%d", Prefix, os.Getpid(), role, namespaces.Add(1))
	t.Cleanup(func() {
		if err := deleteNS(name); err != nil {
			t.Errorf("clean up namespace %s: %v", name, err)
		}
	})
	if err := IP("netns", "add", name); err != nil {
		t.Fatalf("new namespace: %v", err)
	}
	if err := IP("-n", name, "link", "set", "lo", "up"); err != nil {
		t.Fatalf("new namespace: %v", err)
	}
	return name
}

// IP runs one iproute2 command ("ip ARGS…") and returns its error with the
// output, for helpers that wire their own namespaces.
func IP(args ...string) error { return ip(args...) }
