package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/proxy/statusapi"
	"github.com/kpproxy/kp/test/netns"
)

// kp killed (SIGKILL) inside each step of a switch, under traffic: while
// it programs the new mode (the IPv4 rules written, the IPv6 ones not
// yet), while it verifies it (both modes' rules complete), and while it
// removes the old mode (its IPv4 chains gone, the IPv6 ones not yet). A
// breakpoint holds kp at that point (an iptables binary it runs waits
// there), the status API shows the step under way, and a second switch
// asked meanwhile is refused with the running one's number and target.
// Then kp is killed: the kernel keeps serving; restarted, kp runs its
// configured mode and removes the other's rules; kp migrate node run again
// completes the switch. No connection fails and the UDP flow loses
// nothing, throughout.
func TestMigrateNodeInterruptedMidSwitchIsSafeToReRun(t *testing.T) {
	netns.Require(t, "nft", "iptables-nft-save", "iptables-legacy-save", "ip6tables-nft-save", "ip6tables-legacy-save")
	t.Parallel()
	for _, c := range []struct {
		step     string
		from, to mode
		// The call kp stops in: the binary, and a string its arguments
		// or its input hold.
		bin, holds string
	}{
		{step: "program", from: modeNFTables, to: modeIPTablesLegacy, bin: "ip6tables-legacy-restore", holds: ":KP-SERVICES "},
		// The verify step reads the new mode's counters before it probes.
		{step: "verify", from: modeNFTables, to: modeIPTablesLegacy, bin: "iptables-legacy-save", holds: " -c"},
		{step: "remove", from: modeIPTablesLegacy, to: modeNFTables, bin: "ip6tables-legacy-restore", holds: "-X KP-"},
	} {
		t.Run("killed-in-"+c.step, func(t *testing.T) {
			skipUnselected(t, c.to)
			w := prepareTourWorld(t, tour{start: c.from})
			e := w.e
			bp := newBreakpoint(t)
			bp.startKP(e)
			w.ready(c.from)
			tr := w.traffic(t)

			bp.arm(c.bin, c.holds)
			done := make(chan error, 1)
			go func() { _, err := e.tryMigrate("--to", c.to.name); done <- err }()
			call := bp.reached(e)
			m, err := migrationOf(e)
			if err != nil {
				t.Fatal(err)
			}
			if last := m.Steps[len(m.Steps)-1]; last.Name != c.step || !last.Ended.IsZero() || m.Phase != statusapi.MigrationRunning {
				t.Fatalf("kp stopped in %s, but the switch shows step %s (ended %v), phase %s", call, last.Name, last.Ended, m.Phase)
			}
			t.Logf("kp stopped in step %s of switch %d, in %s", c.step, m.ID, call)
			e.refusedWhileUnderWay(m)

			e.kp.Kill()
			if err := <-done; err == nil {
				t.Error("kp migrate node succeeded although kp was killed mid-switch")
			}
			t.Logf("rules after the kill: %v", e.rulesOf())
			tr.flowing(5) // the kernel serves without kp
			if err := e.kp.Start(); err != nil {
				t.Fatal(err)
			}
			e.waitHealthy()
			// The other mode's rules, which the restarted kp removes.
			other := func(got map[string][]string) []string {
				if c.from.iptables() {
					return got[listNFTables]
				}
				return append(got["iptables-legacy-save"], got["ip6tables-legacy-save"]...)
			}
			e.eventually("the restarted kp in "+c.from.name+", removing the other mode's rules", 15*time.Second, func() error {
				if got := w.running(t); got != c.from.proxyMode {
					return fmt.Errorf("kp runs %s", got)
				}
				if left := other(e.rulesOf()); len(left) > 0 {
					return fmt.Errorf("the node still lists %v", left)
				}
				return nil
			})
			e.expectOnly(c.from.name)
			tr.flowing(5)

			out := e.migrate("--to", c.to.name)
			t.Logf("kp migrate node --to %s, again:\n%s", c.to.name, out)
			e.expectOnly(c.to.name)
			e.nothingToDo(c.to.name)
			tr.flowing(5)
			tr.stop("")
		})
	}
}

// refusedWhileUnderWay asks for another switch while m runs: kp migrate
// node fails, naming m's number and target.
func (e *env) refusedWhileUnderWay(m *statusapi.Migration) {
	e.t.Helper()
	want := fmt.Sprintf("switch %d to %s (asked by kp migrate node) is running", m.ID, m.To)
	out, err := e.tryMigrate("--to", "userspace")
	if err == nil || !strings.Contains(out, want) {
		e.t.Errorf("kp migrate node --to userspace while switch %d runs: %v, want it refused saying %q:\n%s", m.ID, err, want, out)
	} else {
		e.t.Logf("kp migrate node --to userspace meanwhile, refused: %s", strings.TrimSpace(tail(out, 1)))
	}
}

// breakpoint holds kp inside a chosen call of an iptables binary: kp runs
// with a folder first on its PATH holding a wrapper for each iptables
// binary, which runs the real one unless the test has armed the
// breakpoint for it; then the first call whose arguments or input hold the
// armed string stops there, records that it was reached, and waits
// (never running the real binary) until kp's process group is killed.
type breakpoint struct {
	t   *testing.T
	dir string
}

func newBreakpoint(t *testing.T) *breakpoint {
	bp := &breakpoint{t: t, dir: t.TempDir()}
	for _, fl := range []string{"legacy", "nft"} {
		for _, bin := range []string{"iptables", "ip6tables"} {
			for _, suffix := range []string{"", "-save", "-restore"} {
				name := bin + "-" + fl + suffix
				real, err := exec.LookPath(name)
				if err != nil {
					continue
				}
				if err := os.WriteFile(filepath.Join(bp.dir, name), []byte(fmt.Sprintf(breakpointScript, real, bp.dir)), 0o755); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	return bp
}

// breakpointScript is a wrapper: %[1]s the real binary, %[2]s the
// breakpoint's folder (armed: the binary's name, then the string; hit:
// the call that stopped).
const breakpointScript = `#!/bin/sh
in=$(mktemp "%[2]s/in.XXXXXX")
cat > "$in"
if [ -f "%[2]s/armed" ] && [ "$(sed -n 1p "%[2]s/armed")" = "${0##*/}" ] &&
	{ printf '%%s\n' "$*"; cat "$in"; } | grep -qF -- "$(sed -n 2p "%[2]s/armed")" &&
	mv "%[2]s/armed" "%[2]s/held" 2>/dev/null; then
	printf '%%s %%s\n' "${0##*/}" "$*" > "%[2]s/hit"
	rm -f "$in"
	sleep 300
	exit 1
fi
"%[1]s" "$@" < "$in"
rc=$?
rm -f "$in"
exit $rc
`

// startKP starts kp in e's node with the breakpoint's folder first on its
// PATH, and waits until it is healthy.
func (bp *breakpoint) startKP(e *env) {
	kp, err := netns.Build("./cmd/kp")
	if err != nil {
		bp.t.Fatalf("kp does not build: %v", err)
	}
	e.kp = e.w.StartInNode(bp.t, "/usr/bin/env", append([]string{"PATH=" + bp.dir + ":" + os.Getenv("PATH"), kp}, e.kpArgs()...)...)
	e.kp.Name = "kp" // env execs it: the process is kp's
	e.waitHealthy()
}

// arm makes the next call of bin whose arguments or input hold s stop.
func (bp *breakpoint) arm(bin, s string) {
	if err := os.WriteFile(filepath.Join(bp.dir, "armed"), []byte(bin+"\n"+s+"\n"), 0o644); err != nil {
		bp.t.Fatal(err)
	}
}

// reached waits until kp stopped at the breakpoint and returns the call.
func (bp *breakpoint) reached(e *env) string {
	var call string
	e.eventually("kp reaching the breakpoint", 30*time.Second, func() error {
		b, err := os.ReadFile(filepath.Join(bp.dir, "hit"))
		if err != nil || !strings.HasSuffix(string(b), "\n") {
			return fmt.Errorf("not yet (%v)", err)
		}
		call = strings.TrimSpace(string(b))
		return nil
	})
	return call
}
