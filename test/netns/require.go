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
	skip := func(format string, args ...any) { t.Helper(); Unavailable(t, format, args...) }
	if os.Geteuid() != 0 {
		skip("skipped: needs root to create network namespaces (run as root, e.g. sudo go test ./test/...)")
	}
	for _, c := range append([]string{"ip"}, commands...) {
		if _, err := exec.LookPath(c); err != nil {
			skip("skipped: needs %q on the PATH (apt-get install iproute2 nftables)", c)
		}
	}
}

// Unavailable skips t for something this machine lacks that the test
// needs (root, a command, a built file), saying what; under CI (CI set)
// it fails t instead, as Require does. Every skip of a test for a missing
// requirement goes through here: make test's skip ledger (test/skips)
// fails a CI run on any skip test/skips.allow does not name.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}
