package vm

import (
	"strings"
	"testing"
)

// A VM runner's check of a run's verbose output: each named test must
// have run, and every test in the output passed or skipped with an
// allowed reason; a run cut short names the tests it left unfinished, and
// a name is matched whole (TestKernelIs61 is not TestKernelIs61Too). (A
// test binary's output ends with PASS or FAIL; test2json reports a test's
// end on the line after its --- line.)
func TestClaimCheckNamesEveryTestThatBreaksIt(t *testing.T) {
	const done = `=== RUN   TestKernelIs61
--- PASS: TestKernelIs61 (0.01s)
=== RUN   TestNetnsTools
=== RUN   TestNetnsTools/nft
    probe_test.go:9: skipped: nft is not installed
--- PASS: TestNetnsTools (0.02s)
    --- SKIP: TestNetnsTools/nft (0.01s)
`
	cut := done + "=== RUN   TestIPVSVirtualServerReadsBack\n"
	allowNFT := func(string) []string { return []string{"nft is not installed"} }
	for _, tc := range []struct {
		name  string
		out   string
		claim Claim
		want  []string
	}{{
		name:  "a skipped subtest and a run cut short",
		out:   cut,
		claim: Claim{Pass: []string{"TestKernelIs61", "TestNetnsTools"}},
		want:  []string{"TestIPVSVirtualServerReadsBack started and never ended", "TestNetnsTools/nft skipped with a reason not in its committed list"},
	}, {
		name:  "the skip's reason allowed",
		out:   done + "PASS\n",
		claim: Claim{Pass: []string{"TestKernelIs61", "TestNetnsTools"}, SkipReasons: allowNFT},
	}, {
		name:  "a name matched whole",
		out:   strings.ReplaceAll(done+"PASS\n", "TestKernelIs61", "TestKernelIs61Too"),
		claim: Claim{Pass: []string{"TestKernelIs61"}, SkipReasons: allowNFT},
		want:  []string{"TestKernelIs61 never ran"},
	}, {
		name:  "a failure",
		out:   strings.Replace(done, "--- PASS: TestKernelIs61", "--- FAIL: TestKernelIs61", 1) + "FAIL\n",
		claim: Claim{SkipReasons: allowNFT},
		want:  []string{"TestKernelIs61 failed"},
	}, {
		// The digest of make test keeps a message's first lines: the
		// failure's own messages come first, its setup's logs after.
		name: "a failure's last messages first",
		out: "=== RUN   TestMigrate\n    m_test.go:1: setup\n    m_test.go:2: kp migrate node:\n        log line\n" +
			"    m_test.go:3: 1 of 822 connections refused\n    process.go:69: --- kp in kpt-1-node: log /tmp/x/kp.log ---\n        I1127 log\n" +
			"        --- end of kp log ---\n--- FAIL: TestMigrate (1.00s)\nFAIL\n",
		want: []string{"TestMigrate failed; its last messages:\n    m_test.go:1: setup\n    m_test.go:2: kp migrate node:\n    m_test.go:3: 1 of 822 connections refused\nits whole output:"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			errs := CheckRun(tc.out, tc.claim)
			if len(errs) != len(tc.want) {
				t.Fatalf("%d errors, want %d: %v", len(errs), len(tc.want), errs)
			}
			for i, e := range errs {
				if !strings.Contains(e.Error(), tc.want[i]) {
					t.Errorf("error %d = %v, want it to say %q", i, e, tc.want[i])
				}
			}
		})
	}
}
