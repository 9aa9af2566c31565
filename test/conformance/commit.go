package conformance

import (
	"os/exec"
	"strings"
)

// Outputs are the files the run itself rewrites after each column: a
// change to them is not a change to what the next column builds.
var Outputs = []string{"test/conformance/REPORT.md", "test/conformance/results.json"}

// buildLabel names what a kp column built, from the tree at root: commit
// when HEAD is still commit and no tracked file but the run's own Outputs
// differs from it, else commit+"-dirty" (which Results.Write refuses). The
// run checks the tree clean at its start (cleanCommit); each kp column
// builds again, after earlier columns rewrote the report, so "git describe
// --dirty" there would call every kp column after the first dirty.
func buildLabel(root, commit string) string {
	cmd := exec.Command("git", "describe", "--always") // as cleanCommit names it
	cmd.Dir = root
	head, err := cmd.Output()
	if err != nil || strings.TrimSpace(string(head)) != commit {
		return commit + "-dirty"
	}
	args := []string{"status", "--porcelain", "--untracked-files=no", "--", "."}
	for _, o := range Outputs {
		args = append(args, ":(exclude)"+o)
	}
	cmd = exec.Command("git", args...)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil || strings.TrimSpace(string(out)) != "" {
		return commit + "-dirty"
	}
	return commit
}
