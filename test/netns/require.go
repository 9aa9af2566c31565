package netns

import (
	"os"
	"os/exec"
	"testing"
)

// Require skips the test unless it runs as root with iproute2's ip on the
// PATH: those are what building network namespaces takes. Extra commands the
// test needs (for example "nft") can be named too. Under CI (CI set in the
// environment) a missing requirement fails the test instead: CI installs
// everything, so a skip there would hide a broken setup.
func Require(t testing.TB, commands ...string) {
	t.Helper()
	skip := t.Skipf
	if os.Getenv("CI") != "" {
		skip = t.Fatalf
	}
	if os.Geteuid() != 0 {
		skip("skipped: needs root to create network namespaces (run as root, e.g. sudo go test ./test/...)")
	}
	for _, c := range append([]string{"ip"}, commands...) {
		if _, err := exec.LookPath(c); err != nil {
			skip("skipped: needs %q on the PATH (apt-get install iproute2 nftables)", c)
		}
	}
}
