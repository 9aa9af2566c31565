package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// events is a go test -json stream: one allowed skip, one skip nobody
// explained, a pass and a failure.
const events = `{"Action":"run","Package":"github.com/kpproxy/kp/test/e2e","Test":"TestA/ipvs"}
{"Action":"output","Package":"github.com/kpproxy/kp/test/e2e","Test":"TestA/ipvs","Output":"=== RUN   TestA/ipvs\n"}
{"Action":"output","Package":"github.com/kpproxy/kp/test/e2e","Test":"TestA/ipvs","Output":"    ipvs_test.go:18: ipvs mode: this kernel has no IPVS (no /proc/net/ip_vs)\n"}
{"Action":"output","Package":"github.com/kpproxy/kp/test/e2e","Test":"TestA/ipvs","Output":"    --- SKIP: TestA/ipvs (0.00s)\n"}
{"Action":"skip","Package":"github.com/kpproxy/kp/test/e2e","Test":"TestA/ipvs"}
{"Action":"output","Package":"github.com/kpproxy/kp/nft","Test":"TestB","Output":"    b_test.go:9: flaky today\n"}
{"Action":"skip","Package":"github.com/kpproxy/kp/nft","Test":"TestB"}
{"Action":"output","Package":"github.com/kpproxy/kp/nft","Test":"TestC","Output":"    c_test.go:5: a passing test's log\n"}
{"Action":"pass","Package":"github.com/kpproxy/kp/nft","Test":"TestC"}
{"Action":"output","Package":"github.com/kpproxy/kp/nft","Test":"TestD","Output":"=== RUN   TestD\n"}
{"Action":"output","Package":"github.com/kpproxy/kp/nft","Test":"TestD","Output":"    d_test.go:7: got 1, want 2\n"}
{"Action":"output","Package":"github.com/kpproxy/kp/nft","Test":"TestD","Output":"--- FAIL: TestD (0.01s)\n"}
{"Action":"fail","Package":"github.com/kpproxy/kp/nft","Test":"TestD"}
{"Action":"output","Package":"github.com/kpproxy/kp/nft","Output":"FAIL\n"}
{"Action":"output","Package":"github.com/kpproxy/kp/nft","Output":"FAIL\tgithub.com/kpproxy/kp/nft\t0.1s\n"}
{"Action":"output","Package":"github.com/kpproxy/kp/test/e2e","Output":"PASS\n"}
{"Action":"output","Package":"github.com/kpproxy/kp/test/e2e","Output":"ok  \tgithub.com/kpproxy/kp/test/e2e\t0.1s\n"}
`

const allowlist = "# comment\ntest/e2e\tTest.*/ipvs\tthis kernel has no IPVS\n"

// The ledger counts every skip with its reason and, under CI only, fails
// on one the allowlist does not name with its reason.
func TestLedgerFailsUnderCIOnASkipTheAllowlistDoesNotName(t *testing.T) {
	dir := t.TempDir()
	jsonFile, allowFile := filepath.Join(dir, "log.json"), filepath.Join(dir, "skips.allow")
	if err := os.WriteFile(jsonFile, []byte(events), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		allow    string
		ci       bool
		wantCode int
		want     []string
	}{
		{"under CI, an unexplained skip", allowlist, true, 1, []string{"2 tests skipped, 1 not in", "not allowed: github.com/kpproxy/kp/nft TestB: flaky today", "FAIL: under CI, 1 skips"}},
		{"outside CI, listed but not failed", allowlist, false, 0, []string{"2 tests skipped, 1 not in", "not allowed: github.com/kpproxy/kp/nft TestB"}},
		{"under CI, every skip named", allowlist + "nft\tTestB\tflaky today\n", true, 0, []string{"2 tests skipped, 0 not in", "1  github.com/kpproxy/kp/test/e2e: ipvs mode: this kernel has no IPVS"}},
		{"under CI, the right test with another reason", allowlist + "nft\tTestB\tno kernel\n", true, 1, []string{"not allowed: github.com/kpproxy/kp/nft TestB"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(allowFile, []byte(tc.allow), 0o644); err != nil {
				t.Fatal(err)
			}
			var out strings.Builder
			if code := runLedger(jsonFile, allowFile, tc.ci, &out); code != tc.wantCode {
				t.Errorf("exit code %d, want %d:\n%s", code, tc.wantCode, out.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("ledger lacks %q:\n%s", w, out.String())
				}
			}
		})
	}
}

// The filter prints what a plain go test would: the packages' lines and a
// failed test's output, not a passing or skipped test's, nor the framing.
func TestFilterPrintsPackagesAndFailedTestsOnly(t *testing.T) {
	var out, raw strings.Builder
	if err := filter(strings.NewReader(events+"go: a line of the go command\n"), &out, &raw); err != nil {
		t.Fatal(err)
	}
	want := "    d_test.go:7: got 1, want 2\n--- FAIL: TestD (0.01s)\nFAIL\nFAIL\tgithub.com/kpproxy/kp/nft\t0.1s\n" +
		"ok  \tgithub.com/kpproxy/kp/test/e2e\t0.1s\ngo: a line of the go command\n"
	if out.String() != want {
		t.Errorf("filtered output:\n%s\nwant:\n%s", out.String(), want)
	}
	if raw.String() != events+"go: a line of the go command\n" {
		t.Errorf("the raw copy differs from the input")
	}
}
