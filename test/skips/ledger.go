package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
)

// event is one line of `go test -json` (test2json's format).
type event struct {
	Action, Package, Test, Output string
}

// framing are the verbose format's lines about scheduling, which a plain
// `go test` does not print.
func framing(line string) bool {
	for _, p := range []string{"=== RUN ", "=== PAUSE ", "=== CONT ", "=== NAME "} {
		if strings.HasPrefix(line, p) {
			return true
		}
	}
	return false
}

// newScanner reads lines of any length a test may log (a VM's whole
// output is relayed as one test's log).
func newScanner(r io.Reader) *bufio.Scanner {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 256<<20)
	return sc
}

// filter copies every line of in to raw and writes to out what a plain
// `go test` prints: the packages' lines (ok, FAIL, no test files, a
// panic), build errors, and a failed test's output (its log and its
// --- FAIL line), held back until the test ends; tests that never ended
// (a timeout) are printed at the end. A line that is not an event (the go
// command's own messages) is printed as it is.
func filter(in io.Reader, out, raw io.Writer) error {
	held := map[string]*strings.Builder{}
	var order []string
	sc := newScanner(in)
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintln(raw, line)
		var e event
		if !strings.HasPrefix(line, "{") || json.Unmarshal([]byte(line), &e) != nil {
			fmt.Fprintln(out, line)
			continue
		}
		switch {
		case e.Action == "build-output":
			io.WriteString(out, e.Output)
		case e.Test == "":
			if e.Action == "output" && e.Output != "PASS\n" && !framing(e.Output) {
				io.WriteString(out, e.Output)
			}
		default:
			key := e.Package + " " + e.Test
			switch e.Action {
			case "output":
				if framing(e.Output) {
					continue
				}
				b := held[key]
				if b == nil {
					b = &strings.Builder{}
					held[key] = b
					order = append(order, key)
				}
				b.WriteString(e.Output)
			case "fail":
				if b := held[key]; b != nil {
					io.WriteString(out, b.String())
				}
				delete(held, key)
			case "pass", "skip":
				delete(held, key)
			}
		}
	}
	for _, key := range order {
		if b := held[key]; b != nil {
			fmt.Fprintf(out, "(%s never ended; its output:)\n%s", key, b.String())
		}
	}
	return sc.Err()
}

// skip is one skipped test and the message it skipped with.
type skip struct {
	Package, Test, Reason string
}

// location is the file.go:N: a test's message starts with.
var location = regexp.MustCompile(`^\s*[A-Za-z0-9_.-]+\.go:\d+: `)

// readSkips returns the skipped tests of a go test -json stream, each
// with its message (its output without the framing and --- SKIP lines, and
// without the message's file.go:N:).
func readSkips(r io.Reader) ([]skip, error) {
	held := map[string]*strings.Builder{}
	var skips []skip
	sc := newScanner(r)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Test == "" {
			continue
		}
		key := e.Package + " " + e.Test
		switch e.Action {
		case "output":
			if framing(e.Output) || strings.HasPrefix(strings.TrimSpace(e.Output), "--- ") {
				continue
			}
			if held[key] == nil {
				held[key] = &strings.Builder{}
			}
			held[key].WriteString(location.ReplaceAllString(e.Output, ""))
		case "skip":
			reason := ""
			if b := held[key]; b != nil {
				reason = strings.TrimSpace(b.String())
			}
			skips = append(skips, skip{Package: e.Package, Test: e.Test, Reason: reason})
			delete(held, key)
		case "pass", "fail":
			delete(held, key)
		}
	}
	return skips, sc.Err()
}

// allowance is one line of the allowlist: a package (its path, or the end
// of it after a slash), a test (a regexp of the whole name) and a reason
// (a part of the skip's message).
type allowance struct {
	pkg    string
	test   *regexp.Regexp
	reason string
}

// readAllowlist reads lines of three tab-separated fields (runs of tabs
// are one separator); # starts a comment line.
func readAllowlist(file string) ([]allowance, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var list []allowance
	for i, line := range strings.Split(string(data), "\n") {
		if strings.TrimSpace(line) == "" || strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		var f []string
		for _, s := range strings.Split(line, "\t") {
			if s = strings.TrimSpace(s); s != "" {
				f = append(f, s)
			}
		}
		if len(f) != 3 {
			return nil, fmt.Errorf("%s:%d: want package<TAB>test regexp<TAB>reason, got %q", file, i+1, line)
		}
		re, err := regexp.Compile("^(?:" + f[1] + ")$")
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %v", file, i+1, err)
		}
		list = append(list, allowance{pkg: f[0], test: re, reason: f[2]})
	}
	return list, nil
}

func (a allowance) allows(s skip) bool {
	return (s.Package == a.pkg || strings.HasSuffix(s.Package, "/"+a.pkg)) && a.test.MatchString(s.Test) &&
		strings.Contains(s.Reason, a.reason)
}

func allowed(list []allowance, s skip) bool {
	for _, a := range list {
		if a.allows(s) {
			return true
		}
	}
	return false
}

// printLedger prints how many tests skipped, grouped by package and
// reason (the message's first line), then every skip the allowlist does
// not name; it returns how many those are.
func printLedger(w io.Writer, skips []skip, list []allowance, allowFile string) int {
	type group struct {
		n     int
		tests []string
	}
	groups := map[string]*group{}
	var bad []skip
	for _, s := range skips {
		first, _, _ := strings.Cut(s.Reason, "\n")
		if first == "" {
			first = "(no message)"
		}
		k := s.Package + ": " + first
		if groups[k] == nil {
			groups[k] = &group{}
		}
		groups[k].n++
		if len(groups[k].tests) < 3 {
			groups[k].tests = append(groups[k].tests, s.Test)
		}
		if !allowed(list, s) {
			bad = append(bad, s)
		}
	}
	fmt.Fprintf(w, "\n===== skip ledger: %d tests skipped, %d not in %s =====\n", len(skips), len(bad), allowFile)
	keys := make([]string, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		g := groups[k]
		more := ""
		if g.n > len(g.tests) {
			more = ", …"
		}
		fmt.Fprintf(w, "%4d  %s  (%s%s)\n", g.n, k, strings.Join(g.tests, ", "), more)
	}
	for _, s := range bad {
		fmt.Fprintf(w, "not allowed: %s %s: %s\n", s.Package, s.Test, s.Reason)
	}
	return len(bad)
}
