package vm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"regexp"
	"sort"
	"strings"
)

// Result is how one test (or subtest, "TestX/ipvs") of a run ended:
// "pass", "fail" or "skip", and what it printed.
type Result struct {
	Action string
	Output string
}

// Results are a `go test -v` run's tests by full name. A test that
// started and never ended (the run was cut short) has Action "".
type Results map[string]*Result

// ParseResults reads a test binary's -test.v output (what Run returns for
// RunPackage or a -test.v command) with the toolchain's own parser, go
// tool test2json, which knows the verbose format's interleaving of
// parallel tests (=== NAME, --- lines of subtests under their parent).
func ParseResults(out string) (Results, error) {
	cmd := exec.Command("go", "tool", "test2json", "-t")
	cmd.Stdin = strings.NewReader(out)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	events, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go tool test2json: %v\n%s", err, stderr.String())
	}
	return decodeEvents(events)
}

// decodeEvents folds test2json's events into Results.
func decodeEvents(events []byte) (Results, error) {
	r := Results{}
	dec := json.NewDecoder(bytes.NewReader(events))
	for dec.More() {
		var e struct{ Action, Test, Output string }
		if err := dec.Decode(&e); err != nil {
			return nil, fmt.Errorf("test2json's events: %w", err)
		}
		if e.Test == "" {
			continue
		}
		res := r[e.Test]
		if res == nil {
			res = &Result{}
			r[e.Test] = res
		}
		switch e.Action {
		case "output":
			res.Output += e.Output
		case "pass", "fail", "skip":
			res.Action = e.Action
		}
	}
	return r, nil
}

// Claim is what a VM run must show: every test in Pass ran, by full
// name; every test that ran (the named ones, their subtests, any other)
// passed, or was skipped with a reason from the committed list
// SkipReasons returns for its name (nil: no skip is allowed); nothing
// failed or was left unfinished. A named test that skipped with an
// allowed reason is the claim's own exception (e2e: a mode that does not
// claim a feature, with the reason the feature table's column gives (docs/features.md)).
type Claim struct {
	Pass        []string
	SkipReasons func(test string) []string
}

// Check returns what in r breaks the claim, one error per test, sorted;
// none when the run holds it.
func (c Claim) Check(r Results) []error {
	var errs []error
	for _, name := range c.Pass {
		if _, ok := r[name]; !ok {
			errs = append(errs, fmt.Errorf("%s never ran", name))
		}
	}
	names := make([]string, 0, len(r))
	for name := range r {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		res := r[name]
		switch res.Action {
		case "pass":
		case "fail":
			errs = append(errs, fmt.Errorf("%s failed; its last messages:\n%s\nits whole output:\n%s",
				name, indent(lastMessages(res.Output, failMessages)), indent(res.Output)))
		case "":
			errs = append(errs, fmt.Errorf("%s started and never ended (the run was cut short)", name))
		case "skip":
			if !c.skipAllowed(name, res.Output) {
				errs = append(errs, fmt.Errorf("%s skipped with a reason not in its committed list:\n%s", name, indent(res.Output)))
			}
		}
	}
	return errs
}

func (c Claim) skipAllowed(name, output string) bool {
	if c.SkipReasons == nil {
		return false
	}
	for _, reason := range c.SkipReasons(name) {
		if reason != "" && strings.Contains(output, reason) {
			return true
		}
	}
	return false
}

// failMessages is how many of a failed test's last messages its error
// names before its whole output: test/failures.sh, the digest at the end
// of make test, keeps only a message's first continuation lines, and a
// test's first lines (its setup's) rarely say what failed.
const failMessages = 5

// message is a test's message line in go test -v output: file.go:N: text.
var message = regexp.MustCompile(`^\s*[A-Za-z0-9_.-]+\.go:[0-9]+: `)

// processLog is the header of a process's log a failed test prints.
var processLog = regexp.MustCompile(`^\s*[A-Za-z0-9_.-]+\.go:[0-9]+: --- .* (log|in) `)

// lastMessages returns the last n message lines of a test's output (their
// first lines only), "(no messages)" when it has none.
func lastMessages(out string, n int) string {
	var msgs []string
	for _, line := range strings.Split(out, "\n") {
		// A process's log that the test prints when it fails (netns'
		// "--- NAME in NS: log ... ---" headers) is not what failed.
		if message.MatchString(line) && !processLog.MatchString(line) {
			msgs = append(msgs, strings.TrimSpace(line))
		}
	}
	if len(msgs) == 0 {
		return "(no messages)"
	}
	return strings.Join(msgs[max(0, len(msgs)-n):], "\n")
}

func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return "    (no output)"
	}
	return "    " + strings.ReplaceAll(s, "\n", "\n    ")
}

// Summary counts the tests by how they ended: "12 passed, 3 skipped,
// 0 failed, 0 unfinished".
func (r Results) Summary() string {
	n := map[string]int{}
	for _, res := range r {
		n[res.Action]++
	}
	return fmt.Sprintf("%d passed, %d skipped, %d failed, %d unfinished", n["pass"], n["skip"], n["fail"], n[""])
}

// CheckRun parses a VM run's -test.v output and checks the claim on it:
// the errors name every test that broke it, or the output could not be
// parsed.
func CheckRun(out string, c Claim) []error {
	r, err := ParseResults(out)
	if err != nil {
		return []error{err}
	}
	return c.Check(r)
}
