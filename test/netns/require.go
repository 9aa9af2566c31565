package netns

import (
	"os"
	"os/exec"
	"testing"
)

// Require skips the test unless it runs as root with iproute2's ip on the
// PATH: those are what building network namespaces takes. Extra commands the
// test needs (for example "nft") can be named too.
func Require(t testing.TB, commands ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipped: needs root to create network namespaces (run as root, e.g. sudo go test ./test/...)")
	}
	for _, c := range append([]string{"ip"}, commands...) {
		if _, err := exec.LookPath(c); err != nil {
			t.Skipf("skipped: needs %q on the PATH (apt-get install iproute2 nftables)", c)
		}
	}
}
