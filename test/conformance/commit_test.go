package conformance

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A kp column built after earlier columns rewrote the report is of the
// run's commit; any other change, or another HEAD, makes it dirty. (A run
// on 2026-11-27 labelled every kp column after the first "-dirty" since the
// label came from git describe --dirty, and Write refused the report.)
func TestBuildLabelIgnoresOnlyTheRunsOwnOutputs(t *testing.T) {
	dir := t.TempDir()
	git := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	write := func(name, body string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git("init", "-q")
	for _, o := range Outputs {
		write(o, "old\n")
	}
	write("proxy/core.go", "package proxy\n")
	git("add", "-A")
	git("commit", "-qm", "one")
	commit, err := cleanCommit(dir)
	if err != nil {
		t.Fatal(err)
	}

	for _, o := range Outputs {
		write(o, "a column's results\n")
	}
	if got := buildLabel(dir, commit); got != commit {
		t.Errorf("with only the report rewritten: %q, want %q", got, commit)
	}
	write("proxy/core.go", "package proxy // changed\n")
	if got := buildLabel(dir, commit); got != commit+"-dirty" {
		t.Errorf("with a source file changed: %q, want %q", got, commit+"-dirty")
	}
	git("checkout", "-q", "--", "proxy/core.go")
	git("commit", "-qam", "two")
	if got := buildLabel(dir, commit); got != commit+"-dirty" {
		t.Errorf("at another commit: %q, want %q", got, commit+"-dirty")
	}
}
