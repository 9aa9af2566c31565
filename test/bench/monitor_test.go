package bench

import (
	"bufio"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/kpproxy/kp/test/netns"
)

// monitor is `nft monitor` in a namespace: every line with the time it
// was read.
type monitor struct {
	cmd   *exec.Cmd
	lines chan monitorLine
}

type monitorLine struct {
	text string
	at   time.Time
}

func startMonitor(ns string) (*monitor, error) {
	cmd := exec.Command("ip", "netns", "exec", ns, "nft", "monitor")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	m := &monitor{cmd: cmd, lines: make(chan monitorLine, 1<<16)}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<26)
		for sc.Scan() {
			m.lines <- monitorLine{sc.Text(), time.Now()}
		}
		close(m.lines)
	}()
	return m, nil
}

func (m *monitor) stop() {
	_ = m.cmd.Process.Kill()
	_ = m.cmd.Wait()
}

// drain discards what was read so far.
func (m *monitor) drain() {
	for {
		select {
		case <-m.lines:
		default:
			return
		}
	}
}

// subscribed returns once nft monitor reports a transaction made for the
// purpose in ns: before that, it may not be listening yet.
func (m *monitor) subscribed(ns string) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if out, err := netns.Exec(ns, "nft", "add table ip kp-bench-probe; delete table ip kp-bench-probe"); err != nil {
			return fmt.Errorf("probe transaction: %v: %s", err, out)
		}
		if _, _, err := m.nextCommit(time.Second); err == nil {
			m.drain()
			return nil
		}
	}
	return fmt.Errorf("reported no transaction for a minute")
}

// nextCommit waits for the next "# new generation" line (the kernel
// committed a transaction) and returns when it came and how many objects
// the transaction listed before it.
func (m *monitor) nextCommit(timeout time.Duration) (time.Time, int, error) {
	events := 0
	t := time.After(timeout)
	for {
		select {
		case l, ok := <-m.lines:
			if !ok {
				return time.Time{}, events, fmt.Errorf("nft monitor exited")
			}
			if strings.HasPrefix(l.text, "# new generation") {
				return l.at, events, nil
			}
			if !strings.HasPrefix(l.text, "#") && strings.TrimSpace(l.text) != "" {
				events++
			}
		case <-t:
			return time.Time{}, events, fmt.Errorf("no transaction within %v", timeout)
		}
	}
}
