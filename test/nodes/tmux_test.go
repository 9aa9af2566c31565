package nodes

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// tmux is one tmux server of the test's own (its own socket), running one
// command in a terminal of a fixed size (as test/e2e drives kp top).
type tmux struct {
	t      *testing.T
	socket string
}

// startTmux runs command in a detached w×h terminal; the server is killed
// when the test ends, pass or fail. The pane stays open after the command
// exits, showing "[exited STATUS]".
func startTmux(t *testing.T, w, h int, command string) *tmux {
	t.Helper()
	tm := &tmux{t: t, socket: fmt.Sprintf("kp-nodes-%d-%d", os.Getpid(), time.Now().UnixNano())}
	var path string
	t.Cleanup(func() {
		_ = exec.Command("tmux", "-L", tm.socket, "kill-server").Run()
		if path != "" {
			_ = os.Remove(path) // kill-server leaves the socket file behind
		}
	})
	tm.run("-f", "/dev/null", "new-session", "-d", "-x", fmt.Sprint(w), "-y", fmt.Sprint(h),
		"sh", "-c", command+`; echo "[exited $?]"; sleep 3600`)
	path = strings.TrimSpace(tm.run("display-message", "-p", "#{socket_path}"))
	return tm
}

func (tm *tmux) run(args ...string) string {
	tm.t.Helper()
	out, err := exec.Command("tmux", append([]string{"-L", tm.socket}, args...)...).CombinedOutput()
	if err != nil {
		tm.t.Fatalf("tmux %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// keys types text into the terminal.
func (tm *tmux) keys(text string) { tm.run("send-keys", "-l", text) }

func (tm *tmux) screen() string { return tm.run("capture-pane", "-p") }
