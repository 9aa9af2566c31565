package e2e

import (
	"fmt"
	"strings"
	"time"

	"github.com/kpproxy/kp/test/netns"
)

// Services the migrations carry traffic for: web (TCP and UDP) and api on
// ClusterIPs, stream (the long-lived connection) on one pod.
const (
	apiTCP    = "10.96.0.11:80"
	streamTCP = "10.96.0.12:9000"
)

// onlyFrom waits until 20 new connections in a row from ns to addr are
// all answered by pods.
func (e *env) onlyFrom(ns, addr string, pods ...*netns.Pod) {
	e.t.Helper()
	names := e.podNames(pods...)
	e.eventually(fmt.Sprintf("%s answered only by %v", addr, names), 15*time.Second, func() error {
		counts, err := e.answered(ns, "tcp", addr, 20)
		if err != nil {
			return err
		}
		n := 0
		for _, name := range names {
			n += counts[name]
		}
		if n != 20 {
			return fmt.Errorf("answered by %v", counts)
		}
		return nil
	})
}

// nothingToDo checks that re-running kp migrate node --to target finds
// nothing to do.
func (e *env) nothingToDo(target string) {
	e.t.Helper()
	if out := e.migrate("--to", target); !strings.Contains(out, "Nothing to do") {
		e.t.Errorf("re-running kp migrate node --to %s:\n%s", target, out)
	}
}

// migrate runs kp migrate node in the node namespace, failing the test if
// it fails.
func (e *env) migrate(args ...string) string {
	e.t.Helper()
	out, err := e.tryMigrate(args...)
	if err != nil {
		e.t.Fatalf("kp migrate node %v: %v\n%s\nkp's log:\n%s", args, err, out, tail(e.kp.Log(), 40))
	}
	return out
}

// tryMigrate runs kp migrate node in the node namespace (from any
// goroutine).
func (e *env) tryMigrate(args ...string) (string, error) {
	kp, err := netns.Build("./cmd/kp")
	if err != nil {
		return "", err
	}
	// A switch into ipvs took over 4 minutes in the VM under load.
	cmd := append([]string{kp, "migrate", "node", "--status-socket", e.socket, "--timeout", slow(2 * time.Minute).String()}, args...)
	return e.w.Exec(e.w.Node(), cmd...)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
