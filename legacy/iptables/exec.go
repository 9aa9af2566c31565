package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"

	"github.com/kpproxy/kp/proxy"
)

// debianPackage is the Debian package that ships every binary kp runs
// (iptables-nft-restore, ip6tables-legacy-save, ...).
const debianPackage = "iptables"

// NewRunner returns the Runner of flavor fl and family f. It runs the
// binaries in the network namespace of the thread that calls Restore or
// Save: os/exec forks from the calling thread, so a caller that locked its
// thread into another namespace (internal/nsenter.Run) programs that one.
// A missing binary is reported when a call needs it, naming the package.
func NewRunner(fl Flavor, f proxy.Family) Runner {
	return &execRunner{flavor: fl, family: f}
}

type execRunner struct {
	flavor Flavor
	family proxy.Family
}

func (r *execRunner) Flavor() Flavor        { return r.flavor }
func (r *execRunner) Family() proxy.Family  { return r.family }
func (r *execRunner) String() string        { return string(r.flavor) + "/" + r.family.String() }
func (r *execRunner) restoreBinary() string { return restoreBinary(r.flavor, r.family) }

// Restore runs iptables-restore --noflush --wait. Both flavors accept
// --wait with no seconds (wait as long as the xtables lock is held; the nft
// flavor ignores it, it has no lock).
func (r *execRunner) Restore(ctx context.Context, data []byte) error {
	bin := r.restoreBinary()
	path, err := lookBinary(bin)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, path, "--noflush", "--wait")
	cmd.Stdin = bytes.NewReader(data)
	var stderr bytes.Buffer
	// Stdout stays /dev/null: it carries only the listing of a cache hint
	// (restore_input.go), 48 MB at 10,000 Services; errors go to stderr.
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", bin, ctx.Err())
		}
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			return fmt.Errorf("run %s: %w", bin, err)
		}
		re := newRestoreError(r.flavor, r.family, data, stderr.String())
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			re.Crashed = true
			re.Stderr = strings.TrimSpace(re.Stderr + " (killed by " + ws.Signal().String() + ")")
		}
		return re
	}
	return nil
}

// Save runs iptables-save -t table [-c].
func (r *execRunner) Save(ctx context.Context, table Table, counters bool) ([]byte, error) {
	bin := saveBinary(r.flavor, r.family)
	path, err := lookBinary(bin)
	if err != nil {
		return nil, err
	}
	args := []string{"-t", string(table)}
	if counters {
		args = append(args, "-c")
	}
	cmd := exec.CommandContext(ctx, path, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s -t %s: %w", bin, table, ctx.Err())
		}
		return nil, fmt.Errorf("%s -t %s: %w: %s", bin, table, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// saveBinary is the iptables-save binary of flavor and family, as Debian
// names them.
func saveBinary(fl Flavor, f proxy.Family) string {
	return strings.TrimSuffix(restoreBinary(fl, f), "-restore") + "-save"
}

// lookBinary finds bin on the PATH, or says which package provides it.
func lookBinary(bin string) (string, error) {
	path, err := exec.LookPath(bin)
	if err != nil {
		return "", &MissingBinaryError{Binary: bin}
	}
	return path, nil
}

// MissingBinaryError is a binary kp needs that is not on the PATH.
type MissingBinaryError struct {
	Binary string
}

func (e *MissingBinaryError) Error() string {
	return fmt.Sprintf("%s not found on the PATH: install the Debian package %q (apt-get install %s)",
		e.Binary, debianPackage, debianPackage)
}

// restoreLineRes match the ways iptables-restore 1.8 names the input line
// it refused, in both flavors:
//
//	Error occurred at line: 4          (a rule's arguments were refused)
//	iptables-restore: line 4 failed    (the kernel refused the table's commit;
//	                                    nft adds ": No chain/target/match...")
//	iptables-restore: COMMIT expected at line 4
//
// The first match wins: they never disagree when several appear.
var restoreLineRes = []*regexp.Regexp{
	regexp.MustCompile(`Error occurred at line: (\d+)`),
	regexp.MustCompile(`line (\d+) failed`),
	regexp.MustCompile(`at line:? (\d+)`),
	regexp.MustCompile(`: line (\d+) `),
}

// parseRestoreLine returns the 1-based input line iptables-restore's stderr
// names, 0 when it names none.
func parseRestoreLine(stderr string) int {
	for _, re := range restoreLineRes {
		if m := re.FindStringSubmatch(stderr); m != nil {
			if n, err := strconv.Atoi(m[1]); err == nil {
				return n
			}
		}
	}
	return 0
}

// newRestoreError builds the RestoreError of a refused input: the line
// iptables-restore named and that line's text.
func newRestoreError(fl Flavor, f proxy.Family, data []byte, stderr string) *RestoreError {
	e := &RestoreError{Flavor: fl, Family: f, Stderr: cleanStderr(stderr)}
	e.Line = parseRestoreLine(stderr)
	if e.Line > 0 {
		lines := strings.Split(string(data), "\n")
		if e.Line <= len(lines) {
			e.Text = lines[e.Line-1]
		}
	}
	return e
}

// cleanStderr drops the "Try `iptables-restore -h' ..." hint and blank
// lines and joins the rest on one line, for a log line.
func cleanStderr(s string) string {
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "Try `") {
			continue
		}
		keep = append(keep, l)
	}
	return strings.Join(keep, "; ")
}
