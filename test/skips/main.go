// Command skips is make test's skip ledger. As a filter (-log) it reads
// `go test -json` on stdin and prints what a plain `go test` would (each
// package's ok or FAIL line, a failed test's output), into the log file
// too, keeping every event in the -json file; with -ledger it reads such a
// file and prints how many tests skipped and why, and, under CI (CI set in
// the environment), fails on a skip that the allowlist does not name with
// its reason: a skip under CI is a claim that was not checked.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
)

func main() {
	logFile := flag.String("log", "", "filter: write the plain output here too")
	jsonFile := flag.String("json", "", "filter: write every event here")
	ledger := flag.String("ledger", "", "print the skip ledger of this go test -json file")
	allow := flag.String("allow", "test/skips.allow", "the allowlist: package, test and reason of each skip CI accepts")
	flag.Parse()
	if *ledger != "" {
		os.Exit(runLedger(*ledger, *allow, os.Getenv("CI") != "", os.Stdout))
	}
	if *logFile == "" || *jsonFile == "" {
		fmt.Fprintln(os.Stderr, "usage: skips -log FILE -json FILE < go-test-json | skips -ledger FILE [-allow FILE]")
		os.Exit(2)
	}
	if err := runFilter(os.Stdin, *logFile, *jsonFile); err != nil {
		fmt.Fprintln(os.Stderr, "skips:", err)
		os.Exit(1)
	}
}

func runFilter(in io.Reader, logFile, jsonFile string) error {
	lf, err := os.Create(logFile)
	if err != nil {
		return err
	}
	defer lf.Close()
	jf, err := os.Create(jsonFile)
	if err != nil {
		return err
	}
	defer jf.Close()
	out := bufio.NewWriter(io.MultiWriter(os.Stdout, lf))
	defer out.Flush()
	return filter(in, out, jf)
}

func runLedger(jsonFile, allowFile string, ci bool, w io.Writer) int {
	f, err := os.Open(jsonFile)
	if err != nil {
		fmt.Fprintln(w, "skip ledger:", err)
		return 1
	}
	defer f.Close()
	skips, err := readSkips(f)
	if err != nil {
		fmt.Fprintln(w, "skip ledger:", err)
		return 1
	}
	allowed, err := readAllowlist(allowFile)
	if err != nil {
		fmt.Fprintln(w, "skip ledger:", err)
		return 1
	}
	if bad := printLedger(w, skips, allowed, allowFile); bad > 0 && ci {
		fmt.Fprintf(w, "skip ledger: FAIL: under CI, %d skips are not in %s with their reason (a skip there is a claim not checked)\n", bad, allowFile)
		return 1
	}
	return 0
}
