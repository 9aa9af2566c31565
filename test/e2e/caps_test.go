package e2e

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/test/netns"
)

// capNetRaw is CAP_NET_RAW's bit in /proc/<pid>/status's capability sets.
const capNetRaw = 13

// kp in the nftables mode without NET_RAW (the DaemonSet's proxy container
// with it removed from the capabilities), on a node whose kernel holds no
// iptables-legacy table: kp programs its Services, its take-over and its
// inventory read every iptables flavor without an error (there is nothing
// in legacy iptables, and kp knows it without the capability). Once a
// legacy table exists on the node (anything that ran iptables-legacy
// makes one), kp cannot read it, and its inventory says so, naming the
// table and NET_RAW, rather than listing nothing.
func TestKPWithoutNetRawServesWhereNoLegacyTableExistsAndNamesOneThatDoes(t *testing.T) {
	netns.Require(t, "setpriv", "iptables-legacy")
	e := newEnv(t, modeNFTables, 2)
	pods := e.w.Pods()
	e.write("web.yaml", web(pods...))
	kp, err := netns.Build("./cmd/kp")
	if err != nil {
		t.Fatal(err)
	}
	// As a container runtime drops a capability: from the bounding set,
	// so root's exec does not get it back.
	args := append([]string{"--inh-caps=-all", "--bounding-set=-net_raw", kp}, e.kpArgs()...)
	e.kp = e.w.StartInNode(t, "setpriv", args...)
	e.waitHealthy()
	if caps, err := capabilities(e.kp.Pid()); err != nil || caps["CapBnd"]&(1<<capNetRaw) != 0 || caps["CapEff"]&(1<<capNetRaw) != 0 {
		t.Fatalf("kp's capabilities %x (%v): want no CAP_NET_RAW", caps, err)
	}
	e.answers(e.w.Client(), "tcp", webTCP, e.podNames(pods...)...)

	inventory := func() (string, error) {
		inv, err := e.statusClient().Inventory(t.Context())
		if err != nil {
			return "", err
		}
		return inv.Error, nil
	}
	if msg, err := inventory(); err != nil || msg != "" {
		t.Errorf("inventory without NET_RAW, no legacy table: error %q (%v); want none", msg, err)
	}
	// The take-over ran after the first sync; it logs a failure as a
	// warning naming what it could not read.
	if log := e.kp.Log(); strings.Contains(log, "NET_RAW") || strings.Contains(log, "removing the leftovers of other proxies failed") {
		t.Errorf("kp's log names NET_RAW or a failed take-over:\n%s", log)
	}

	if out, err := e.w.Exec(e.w.Node(), "iptables-legacy", "-t", "filter", "-L", "-n"); err != nil {
		t.Fatalf("iptables-legacy -t filter -L: %v\n%s", err, out)
	}
	// The inventory is taken at most once a second.
	e.eventually("the inventory names the legacy table kp cannot read", 5*time.Second, func() error {
		msg, err := inventory()
		if err != nil {
			return err
		}
		for _, want := range []string{"CAP_NET_RAW", "NET_RAW to the container's capabilities", "(filter in /proc/net/ip_tables_names)"} {
			if !strings.Contains(msg, want) {
				return fmt.Errorf("inventory error %q does not name %q", msg, want)
			}
		}
		t.Logf("inventory: %s", msg)
		return nil
	})
	e.answers(e.w.Client(), "tcp", webTCP, e.podNames(pods...)...)
}

// capabilities reads the capability sets of process pid (CapInh, CapPrm,
// CapEff, CapBnd, CapAmb).
func capabilities(pid int) (map[string]uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	caps := map[string]uint64{}
	for _, line := range strings.Split(string(data), "\n") {
		name, value, ok := strings.Cut(line, ":\t")
		if !ok || !strings.HasPrefix(name, "Cap") {
			continue
		}
		if caps[name], err = strconv.ParseUint(value, 16, 64); err != nil {
			return nil, fmt.Errorf("%s: %w", line, err)
		}
	}
	if len(caps) == 0 {
		return nil, errors.New("no capability sets in /proc/" + strconv.Itoa(pid) + "/status")
	}
	return caps, nil
}
