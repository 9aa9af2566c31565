package conformance

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"
)

// Columns in the order the report shows them; a mode not listed here comes
// after them, in name order.
var columnOrder = []string{"upstream-nftables", "kp-nftables", "upstream-iptables", "kp-iptables", "upstream-ipvs", "kp-ipvs", "kp-userspace"}

// Baseline is the column a kp column is compared with when upstream has no
// column of its mode: a test that passes there must pass in every kp
// column.
const Baseline = "upstream-nftables"

// upstreamPrefix starts the name of an upstream kube-proxy column.
const upstreamPrefix = "upstream-"

// baselineOf is the column kp column mode answers to: upstream kube-proxy
// in the same mode (kp-iptables → upstream-iptables) when the report has
// it, else Baseline. Upstream's columns answer to none ("").
func (r *Results) baselineOf(mode string) string {
	if strings.HasPrefix(mode, upstreamPrefix) {
		return ""
	}
	same := upstreamPrefix + strings.TrimPrefix(mode, "kp-")
	for _, run := range r.Runs {
		if run.Mode == same {
			return same
		}
	}
	return Baseline
}

// The states of one test in one column.
const (
	Passed  = "passed"
	Failed  = "failed"
	Skipped = "skipped"
)

// NotRun is the reason of a test the run ended before (it was
// interrupted).
const NotRun = "not run: the run was interrupted before it"

// SkipRule is one pattern given to ginkgo's --skip, with why the test
// cannot run here.
type SkipRule struct {
	Pattern string `json:"pattern"`
	Reason  string `json:"reason"`
}

// Results is results.json: every column's run and every test's result in
// each.
type Results struct {
	// Commit is the one commit of kp every column was measured at (kp's
	// columns ran its build, upstream's ran on that commit's harness).
	Commit string `json:"commit,omitempty"`
	// Focus is the regular expression (ginkgo --focus) choosing the tests.
	Focus string     `json:"focus"`
	Skips []SkipRule `json:"skips"`
	Runs  []Run      `json:"runs"`
	Tests []Test     `json:"tests"`
}

// Run is one column: one proxy in one mode, on a fresh cluster.
type Run struct {
	Mode    string    `json:"mode"`
	Proxy   string    `json:"proxy"`   // what programmed the nodes, e.g. "kube-proxy v1.36.3 --proxy-mode=nftables"
	Cluster string    `json:"cluster"` // versions and shape of the cluster
	Ginkgo  string    `json:"ginkgo"`  // how the tests ran
	Started time.Time `json:"started"`
	// Seconds is ginkgo's run time; SetupSeconds the cluster's bring-up
	// with the proxy and the DNS.
	Seconds      float64 `json:"seconds"`
	SetupSeconds float64 `json:"setupSeconds"`
	// SuiteFailure is set when the suite's setup or teardown failed.
	SuiteFailure string         `json:"suiteFailure,omitempty"`
	Totals       map[string]int `json:"totals"`
	// Reruns say which tests of the column a later, focused run replaced,
	// when and why.
	Reruns []string `json:"reruns,omitempty"`
}

// Test is one spec of e2e.test, by its full text.
type Test struct {
	Name    string            `json:"name"`
	Results map[string]Result `json:"results"` // by Run.Mode
}

// Result is one test in one column.
type Result struct {
	State   string  `json:"state"`
	Seconds float64 `json:"seconds,omitempty"`
	// Reason is why it was skipped (the skip rule, or the test's own
	// message when it skipped itself), or the first lines of the failure.
	Reason   string `json:"reason,omitempty"`
	Location string `json:"location,omitempty"` // where it failed
}

// ginkgoReport is the part of ginkgo's JSON report (a list of suite
// reports) the run reads.
type ginkgoReport struct {
	SuiteSucceeded bool
	RunTime        time.Duration
	SpecReports    []struct {
		ContainerHierarchyTexts []string
		LeafNodeText            string
		LeafNodeType            string
		State                   string
		RunTime                 time.Duration
		Failure                 *struct {
			Message  string
			Location struct {
				FileName   string
				LineNumber int
			}
		}
	}
}

// ParseGinkgo reads ginkgo's JSON report and returns the result of every
// spec whose text focus matches: run specs as they ended, the ones a skip
// rule left out as skipped with the rule's reason. A failure of the
// suite's own setup or teardown comes back as suiteFailure.
func ParseGinkgo(path string, focus string, skips []SkipRule) (tests map[string]Result, seconds float64, suiteFailure string, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, "", err
	}
	var reports []ginkgoReport
	if err := json.Unmarshal(b, &reports); err != nil {
		return nil, 0, "", fmt.Errorf("ginkgo report %s: %w", path, err)
	}
	focusRE, err := regexp.Compile(focus)
	if err != nil {
		return nil, 0, "", fmt.Errorf("focus: %w", err)
	}
	skipREs := make([]*regexp.Regexp, len(skips))
	for i, s := range skips {
		if skipREs[i], err = regexp.Compile(s.Pattern); err != nil {
			return nil, 0, "", fmt.Errorf("skip %q: %w", s.Pattern, err)
		}
	}
	tests = map[string]Result{}
	for _, r := range reports {
		seconds += r.RunTime.Seconds()
		for _, s := range r.SpecReports {
			name := strings.TrimSpace(strings.Join(append(slices.Clone(s.ContainerHierarchyTexts), s.LeafNodeText), " "))
			if s.LeafNodeType != "It" {
				if s.State != Passed && s.State != Skipped && s.Failure != nil {
					suiteFailure += fmt.Sprintf("%s: %s %s\n", s.LeafNodeType, s.State, firstLines(s.Failure.Message, 8))
				}
				continue
			}
			if !focusRE.MatchString(name) {
				continue
			}
			res := Result{State: state(s.State), Seconds: s.RunTime.Seconds()}
			for i, re := range skipREs {
				if re.MatchString(name) {
					res = Result{State: Skipped, Reason: skips[i].Reason}
					break
				}
			}
			if res.Reason == "" && s.Failure != nil {
				res.Reason = firstLines(s.Failure.Message, 8)
				if res.State != Skipped && s.Failure.Location.FileName != "" {
					res.Location = fmt.Sprintf("%s:%d", trimPath(s.Failure.Location.FileName), s.Failure.Location.LineNumber)
				}
			}
			if res.State == Skipped && res.Reason == "" {
				res.Reason = NotRun
			}
			tests[name] = res
		}
	}
	return tests, seconds, suiteFailure, nil
}

// state maps ginkgo's spec states to the report's three: a panic, a
// timeout or an interruption is a failure.
func state(s string) string {
	switch s {
	case Passed, Skipped:
		return s
	case "pending":
		return Skipped
	}
	return Failed
}

// trimPath shortens a source path to its part from the repository (or
// module) root, e.g. test/e2e/network/service.go.
func trimPath(p string) string {
	if i := strings.Index(p, "/test/e2e/"); i >= 0 {
		return p[i+1:]
	}
	return p
}

// firstLines returns the first n lines of s, marking a cut.
func firstLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = append(lines[:n], "…")
	}
	return strings.Join(lines, "\n")
}

// Load reads results.json; a missing file is an empty result.
func Load(path string) (*Results, error) {
	r := &Results{}
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return r, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

// Set puts one run's column into r, replacing that mode's earlier run: its
// results, and its mark on every test (a test it no longer has keeps the
// other columns).
func (r *Results) Set(run Run, tests map[string]Result) {
	run.Totals = map[string]int{}
	for _, res := range tests {
		run.Totals[res.State]++
	}
	r.Runs = slices.DeleteFunc(r.Runs, func(o Run) bool { return o.Mode == run.Mode })
	r.Runs = append(r.Runs, run)
	sort.SliceStable(r.Runs, func(i, j int) bool { return columnLess(r.Runs[i].Mode, r.Runs[j].Mode) })
	byName := map[string]int{}
	for i := range r.Tests {
		delete(r.Tests[i].Results, run.Mode)
		byName[r.Tests[i].Name] = i
	}
	for name, res := range tests {
		r.put(byName, name, run.Mode, res)
	}
	r.Tests = slices.DeleteFunc(r.Tests, func(t Test) bool { return len(t.Results) == 0 })
	sort.Slice(r.Tests, func(i, j int) bool { return r.Tests[i].Name < r.Tests[j].Name })
}

// put sets test name's result in column mode, adding the test when it is
// new; byName indexes r.Tests by name and is kept up to date.
func (r *Results) put(byName map[string]int, name, mode string, res Result) {
	i, ok := byName[name]
	if !ok {
		r.Tests = append(r.Tests, Test{Name: name, Results: map[string]Result{}})
		i = len(r.Tests) - 1
		byName[name] = i
	}
	r.Tests[i].Results[mode] = res
}

// Merge puts the results of a focused rerun into the column of mode: those
// tests' results are replaced, the others stay, and the column notes it.
func (r *Results) Merge(mode string, tests map[string]Result, note string) error {
	i := slices.IndexFunc(r.Runs, func(o Run) bool { return o.Mode == mode })
	if i < 0 {
		return fmt.Errorf("no column %s to merge a rerun into", mode)
	}
	byName := map[string]int{}
	for j := range r.Tests {
		byName[r.Tests[j].Name] = j
	}
	for name, res := range tests {
		r.put(byName, name, mode, res)
	}
	sort.Slice(r.Tests, func(a, b int) bool { return r.Tests[a].Name < r.Tests[b].Name })
	run := &r.Runs[i]
	run.Totals = map[string]int{}
	for _, t := range r.Tests {
		if res, ok := t.Results[mode]; ok {
			run.Totals[res.State]++
		}
	}
	run.Reruns = append(run.Reruns, note)
	return nil
}

func columnLess(a, b string) bool {
	ia, ib := slices.Index(columnOrder, a), slices.Index(columnOrder, b)
	switch {
	case ia >= 0 && ib >= 0:
		return ia < ib
	case ia >= 0 || ib >= 0:
		return ia >= 0
	}
	return a < b
}

// Regressions lists, for each kp column, the tests that pass in its
// baseline (baselineOf) and do not pass there.
func (r *Results) Regressions() map[string][]string {
	out := map[string][]string{}
	for _, run := range r.Runs {
		baseline := r.baselineOf(run.Mode)
		if baseline == "" {
			continue
		}
		for _, t := range r.Tests {
			base, ok := t.Results[baseline]
			res, ran := t.Results[run.Mode]
			if ok && ran && base.State == Passed && res.State != Passed {
				out[run.Mode] = append(out[run.Mode], t.Name)
			}
		}
	}
	return out
}

// Write writes results.json and REPORT.md. It refuses a report that does
// not name its commit, or holds a column of a build with uncommitted
// changes: a report comes from one run at one commit.
func (r *Results) Write(jsonPath, mdPath string) error {
	if err := r.OneCleanCommit(); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(jsonPath, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.WriteFile(mdPath, []byte(r.Markdown()), 0o644)
}

// OneCleanCommit checks that the report names its commit and that no
// column ran a build with uncommitted changes ("-dirty").
func (r *Results) OneCleanCommit() error {
	if r.Commit == "" || strings.HasSuffix(r.Commit, "-dirty") {
		return fmt.Errorf("the report names no clean commit (%q): make conformance runs from a clean tree", r.Commit)
	}
	for _, run := range r.Runs {
		if strings.Contains(run.Proxy, "-dirty") {
			return fmt.Errorf("column %s ran a build with uncommitted changes (%s): run make conformance again from a clean tree", run.Mode, run.Proxy)
		}
	}
	return nil
}

// StartAt makes r the report of a run at commit. A run at another commit
// than r's replaces every column (the earlier ones are dropped); adding or
// merging some columns into a report of another commit is refused.
func (r *Results) StartAt(commit string, everyColumn bool) error {
	if r.Commit == commit {
		return nil
	}
	if !everyColumn {
		return fmt.Errorf("results.json is of commit %q, this run of %s: run every column (no KP_CONFORMANCE_MODES, no focus merge) for a report of one commit", r.Commit, commit)
	}
	r.Commit, r.Runs, r.Tests = commit, nil, nil
	return nil
}
