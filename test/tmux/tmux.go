// Package tmux drives a terminal program for kp's tests: a tmux server of
// the test's own (its own socket) runs one command in a detached terminal of
// a fixed size, the test types keys and reads the screen, and the server is
// killed when the test ends, pass or fail.
package tmux

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Terminal is one tmux server running one command.
type Terminal struct {
	t      testing.TB
	socket string
}

// Start runs command in a detached w×h terminal. The pane stays open after
// the command exits, showing "[exited STATUS]", so its last words can be
// read.
func Start(t testing.TB, w, h int, command string) *Terminal {
	t.Helper()
	tm := &Terminal{t: t, socket: fmt.Sprintf("kp-test-%d-%d", os.Getpid(), time.Now().UnixNano())}
	var path string
	t.Cleanup(func() {
		_ = exec.Command("tmux", "-L", tm.socket, "kill-server").Run()
		if path != "" {
			_ = os.Remove(path) // kill-server leaves the socket file behind
		}
	})
	tm.Run("-f", "/dev/null", "new-session", "-d", "-x", fmt.Sprint(w), "-y", fmt.Sprint(h),
		"sh", "-c", command+`; echo "[exited $?]"; sleep 3600`)
	path = strings.TrimSpace(tm.Run("display-message", "-p", "#{socket_path}"))
	return tm
}

// Run runs a tmux command against the terminal's server and returns its
// output; a failure fails the test.
func (tm *Terminal) Run(args ...string) string {
	tm.t.Helper()
	out, err := exec.Command("tmux", append([]string{"-L", tm.socket}, args...)...).CombinedOutput()
	if err != nil {
		tm.t.Fatalf("tmux %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Keys types keys as tmux send-keys names them (Enter, Escape), or as text.
func (tm *Terminal) Keys(keys ...string) {
	tm.t.Helper()
	for _, k := range keys {
		if k == "Enter" || k == "Escape" {
			tm.Run("send-keys", k)
		} else {
			tm.Run("send-keys", "-l", k)
		}
		// A terminal program reads an Escape followed at once by a letter
		// as alt+letter.
		time.Sleep(100 * time.Millisecond)
	}
}

// Screen is what the terminal shows, without colours.
func (tm *Terminal) Screen() string { return tm.Run("capture-pane", "-p") }
