package conformance

import (
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

var testSkips = []SkipRule{{Pattern: `\[Disruptive\]`, Reason: "breaks the cluster"}}

func TestParseGinkgoKeepsFocusedSpecsWithTheirStatesAndReasons(t *testing.T) {
	tests, seconds, suiteFailure, err := ParseGinkgo(filepath.Join("testdata", "ginkgo-report.json"), focus, testSkips)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Result{
		"[sig-network] Services should serve a basic endpoint from pods [Conformance]": {State: Passed, Seconds: 12.5},
		"[sig-network] Services should be able to up and down services": {State: Failed, Seconds: 30,
			Reason: "service not reachable\nline 2", Location: "test/e2e/network/service.go:1234"},
		"[sig-network] Services should work after restarting kube-proxy [Disruptive]": {State: Skipped, Reason: "breaks the cluster"},
		"[sig-network] Services should have session affinity work for LoadBalancer service": {State: Skipped,
			Reason: "Only supported for providers [gce gke]"},
		"[sig-network] Services should time out": {State: Failed, Seconds: 900, Reason: "timed out"},
	}
	if !reflect.DeepEqual(tests, want) {
		t.Errorf("tests =\n%#v\nwant\n%#v", tests, want)
	}
	if seconds != 600 || suiteFailure != "" {
		t.Errorf("seconds %v, suite failure %q; want 600, none", seconds, suiteFailure)
	}
}

func TestSetReplacesOneColumnAndRegressionsCompareWithTheBaseline(t *testing.T) {
	r := &Results{Focus: focus, Skips: testSkips}
	r.Set(Run{Mode: "kp-nftables", Started: time.Unix(0, 0)}, map[string]Result{
		"a": {State: Failed, Reason: "x"}, "b": {State: Passed}, "old": {State: Passed},
	})
	r.Set(Run{Mode: Baseline}, map[string]Result{"a": {State: Passed}, "b": {State: Passed}, "c": {State: Skipped, Reason: "breaks the cluster"}})
	if got := []string{r.Runs[0].Mode, r.Runs[1].Mode}; got[0] != Baseline || got[1] != "kp-nftables" {
		t.Errorf("columns %v; want the baseline first", got)
	}
	if got := r.Regressions()["kp-nftables"]; !reflect.DeepEqual(got, []string{"a"}) {
		t.Errorf("regressions %v; want [a]", got)
	}
	// A new kp run replaces its column: "old" is gone, "a" passes.
	r.Set(Run{Mode: "kp-nftables"}, map[string]Result{"a": {State: Passed}, "b": {State: Passed}})
	var names []string
	for _, tc := range r.Tests {
		names = append(names, tc.Name)
	}
	if !reflect.DeepEqual(names, []string{"a", "b", "c"}) {
		t.Errorf("tests %v; want [a b c]", names)
	}
	if reg := r.Regressions(); len(reg) != 0 {
		t.Errorf("regressions %v; want none", reg)
	}
	if r.Runs[1].Totals[Passed] != 2 {
		t.Errorf("kp totals %v", r.Runs[1].Totals)
	}
	md := r.Markdown()
	for _, s := range []string{"| upstream-nftables | kp-nftables |", "| a | passed (0s) | passed (0s) |",
		"| c | skipped (S1) | – |", "- kp-nftables (against upstream-nftables): none.", "| S1 | `\\[Disruptive\\]` | breaks the cluster |"} {
		if !strings.Contains(md, s) {
			t.Errorf("report lacks %q:\n%s", s, md)
		}
	}
}

func TestAKpColumnAnswersToUpstreamInTheSameModeElseTheBaseline(t *testing.T) {
	r := &Results{}
	r.Set(Run{Mode: Baseline}, map[string]Result{"a": {State: Passed}, "b": {State: Passed}})
	r.Set(Run{Mode: "upstream-iptables"}, map[string]Result{"a": {State: Failed}, "b": {State: Passed}})
	r.Set(Run{Mode: "kp-iptables"}, map[string]Result{"a": {State: Failed}, "b": {State: Failed}})
	r.Set(Run{Mode: "kp-ipvs"}, map[string]Result{"a": {State: Failed}, "b": {State: Passed}})
	want := map[string][]string{"kp-iptables": {"b"}, "kp-ipvs": {"a"}}
	if got := r.Regressions(); !reflect.DeepEqual(got, want) {
		t.Errorf("regressions %v; want %v (upstream-iptables fails a too, so kp-iptables owes only b)", got, want)
	}
	var cols []string
	for _, run := range r.Runs {
		cols = append(cols, run.Mode)
	}
	if want := []string{Baseline, "upstream-iptables", "kp-iptables", "kp-ipvs"}; !reflect.DeepEqual(cols, want) {
		t.Errorf("columns %v; want %v", cols, want)
	}
	md := r.Markdown()
	for _, s := range []string{"- kp-iptables (against upstream-iptables): 1, 0 of them explained", "- kp-ipvs (against upstream-nftables): 1, 0 of them explained", "  - **b** (not explained)"} {
		if !strings.Contains(md, s) {
			t.Errorf("report lacks %q:\n%s", s, md)
		}
	}
}

func TestMergeReplacesOnlyTheRerunTestsOfOneColumn(t *testing.T) {
	r := &Results{}
	r.Set(Run{Mode: Baseline}, map[string]Result{"a": {State: Passed}, "b": {State: Passed}})
	r.Set(Run{Mode: "kp-nftables"}, map[string]Result{"a": {State: Failed}, "b": {State: Passed}})
	if err := r.Merge("kp-nftables", map[string]Result{"a": {State: Passed}}, "after a fix"); err != nil {
		t.Fatal(err)
	}
	if got := r.Tests[0].Results["kp-nftables"].State; got != Passed {
		t.Errorf("a in kp-nftables: %s; want passed", got)
	}
	if got := r.Runs[1]; got.Totals[Passed] != 2 || got.Totals[Failed] != 0 || len(got.Reruns) != 1 {
		t.Errorf("kp-nftables run after the merge: %+v", got)
	}
	if err := r.Merge("kp-ipvs", nil, ""); err == nil {
		t.Error("merge into a column that does not exist: no error")
	}
}

func TestAFailureAKnownLimitExplainsIsListedWithIt(t *testing.T) {
	knownLimits["kp-test"] = []Limit{{Failure: regexp.MustCompile(`client IP`), Why: "the client address is not preserved"}}
	defer delete(knownLimits, "kp-test")
	r := &Results{}
	r.Set(Run{Mode: Baseline}, map[string]Result{"a": {State: Passed}, "b": {State: Passed}})
	r.Set(Run{Mode: "kp-test"}, map[string]Result{"a": {State: Failed, Reason: "expected client IP to be preserved"},
		"b": {State: Failed, Reason: "timeout"}})
	md := r.Markdown()
	for _, s := range []string{"- kp-test (against upstream-nftables): 2, 1 of them explained",
		"  - **b** (not explained)", "  - a — *known limit:* the client address is not preserved"} {
		if !strings.Contains(md, s) {
			t.Errorf("report lacks %q:\n%s", s, md)
		}
	}
}

// A report comes from one run at one commit: Write refuses a report with a
// column of a dirty build or without its commit, and a run at another
// commit may not add some columns to it — it replaces them all.
func TestReportIsOfOneCleanCommit(t *testing.T) {
	dir := t.TempDir()
	write := func(r *Results) error {
		return r.Write(dir+"/results.json", dir+"/REPORT.md")
	}
	clean := &Results{Commit: "abc1234", Runs: []Run{{Mode: "kp-nftables", Proxy: "kp abc1234: mode nftables"}}}
	if err := write(clean); err != nil {
		t.Errorf("a clean report: %v", err)
	}
	for name, r := range map[string]*Results{
		"a dirty column": {Commit: "abc1234", Runs: []Run{{Mode: "kp-nftables", Proxy: "kp e5ce5b7-dirty: mode nftables"}}},
		"no commit":      {Runs: []Run{{Mode: "kp-nftables", Proxy: "kp abc1234: mode nftables"}}},
		"a dirty commit": {Commit: "abc1234-dirty"},
	} {
		if err := write(r); err == nil {
			t.Errorf("%s: written, want refused", name)
		}
	}

	old := &Results{Commit: "abc1234", Runs: []Run{{Mode: "kp-nftables"}}, Tests: []Test{{Name: "t"}}}
	if err := old.StartAt("def5678", false); err == nil {
		t.Errorf("some columns of def5678 merged into a report of abc1234")
	}
	if err := old.StartAt("def5678", true); err != nil || old.Commit != "def5678" || len(old.Runs)+len(old.Tests) != 0 {
		t.Errorf("a run of every column at def5678: %v, report %+v: want the earlier columns dropped", err, old)
	}
	same := &Results{Commit: "abc1234", Runs: []Run{{Mode: "kp-nftables"}}}
	if err := same.StartAt("abc1234", false); err != nil || len(same.Runs) != 1 {
		t.Errorf("a column added at the report's own commit: %v", err)
	}
}
