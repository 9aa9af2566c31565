package e2e

import (
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"syscall"

	"github.com/kpproxy/kp/test/logbuf"
)

// resetCapture records, in one namespace (the node's), every TCP reset and
// every ICMP error that passes while a traffic runs (tcpdump on all its
// links): when a connection of the traffic fails, what refused or reset it
// and from which address (an endpoint's RST, the node's own RST for a port
// nothing listens on, a reject rule, IPVS's port unreachable for a virtual
// server without real servers) is in the test's failure message, not only
// in a log a CI digest leaves out.
type resetCapture struct {
	ns string
	*lineCapture
}

// resetFilter selects TCP resets and ICMP errors (not echo), both families.
const resetFilter = "(tcp[tcpflags] & tcp-rst != 0) or (icmp and icmp[icmptype] != icmp-echo and icmp[icmptype] != icmp-echoreply)" +
	" or (icmp6 and ip6[40] < 128) or (ip6 and tcp and ip6[53] & 4 != 0)"

// startResetCapture starts tcpdump in ns; nil (and nothing recorded) when
// it cannot start: the capture only explains a failure.
func startResetCapture(ns string) *resetCapture {
	// -l: line-buffered, so nothing is lost at SIGTERM; -tttt: the wall
	// clock, as the traffic's own failure messages print it.
	lc := startLineCapture(ns, false, func(l string) bool { return !strings.HasPrefix(l, "tcpdump:") },
		"tcpdump", "-i", "any", "-nn", "-l", "-tttt", "-Q", "inout", resetFilter)
	if lc == nil {
		return nil
	}
	return &resetCapture{ns: ns, lineCapture: lc}
}

// stop ends the capture (once) and returns the packets it saw, one line
// each.
func (c *resetCapture) stop() []string {
	if c == nil {
		return nil
	}
	return c.lineCapture.stop()
}

// lineCapture is a command run in the background in one namespace, its
// output read as lines when it stops.
type lineCapture struct {
	cmd   *exec.Cmd
	out   logbuf.Buffer
	keep  func(string) bool
	once  sync.Once
	lines []string
}

// startLineCapture starts args in ns (with its stderr too when stderr);
// the lines stop returns are the non-empty ones keep accepts. nil when the
// command cannot start: a capture only explains a failure.
func startLineCapture(ns string, stderr bool, keep func(string) bool, args ...string) *lineCapture {
	c := &lineCapture{keep: keep}
	c.cmd = exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...)
	c.cmd.Stdout = &c.out
	if stderr {
		c.cmd.Stderr = &c.out
	}
	if err := c.cmd.Start(); err != nil {
		return nil
	}
	return c
}

// stop ends the command (SIGTERM, once) and returns its lines.
func (c *lineCapture) stop() []string {
	if c == nil {
		return nil
	}
	c.once.Do(func() {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		_ = c.cmd.Wait()
		for _, l := range strings.Split(c.out.String(), "\n") {
			if l = strings.TrimSpace(l); l != "" && (c.keep == nil || c.keep(l)) {
				c.lines = append(c.lines, l)
			}
		}
	})
	return c.lines
}

// summary is the capture as one message whose first line says what the
// first packet was.
func (c *resetCapture) summary(lines []string) string {
	if len(lines) == 0 {
		return fmt.Sprintf("the node (%s) saw no TCP reset and no ICMP error during the traffic (tcpdump)", c.ns)
	}
	return fmt.Sprintf("the node (%s) saw %d TCP resets and ICMP errors during the traffic (tcpdump), the first: %s\n%s",
		c.ns, len(lines), lines[0], strings.Join(lines, "\n"))
}
