package conntrack

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
)

// sysctlDir is where the network namespace's netfilter sysctls live, as the
// calling thread's namespace sees them.
const sysctlDir = "/proc/sys/net/netfilter/"

// AccountingSysctl is one sysctl EnableAccounting turns on (to 1).
type AccountingSysctl struct {
	Name string // dotted: net.netfilter.nf_conntrack_acct
	What string // what flows lack without it
}

// AccountingSysctls are the sysctls EnableAccounting turns on: per-flow
// packet and byte counters (nf_conntrack_acct) and creation timestamps
// (nf_conntrack_timestamp). kp sysctl, the DaemonSet's privileged init
// step, turns them on too, so that kp proxy in a container with a
// read-only /proc/sys finds them on.
func AccountingSysctls() []AccountingSysctl {
	return []AccountingSysctl{
		{"net.netfilter.nf_conntrack_acct", "per-flow packet and byte counters"},
		{"net.netfilter.nf_conntrack_timestamp", "per-flow start times"},
	}
}

// EnableAccounting turns on AccountingSysctls in the calling process's
// network namespace, where kp runs, and logs what it turned on. Both are
// per-namespace and only apply to entries created afterwards. It cannot
// fail kp: a sysctl it cannot write (a read-only /proc/sys in a container
// whose init step did not turn it on) is logged and flows simply lack
// counters.
func EnableAccounting(log *slog.Logger) {
	for _, s := range AccountingSysctls() {
		changed, err := ensureSysctl(sysctlDir+strings.TrimPrefix(s.Name, "net.netfilter."), "1")
		switch {
		case err != nil:
			log.Info("cannot turn on conntrack "+s.What+"; flows will lack them", "sysctl", s.Name, "err", err)
		case changed:
			log.Info("turned on conntrack "+s.What+" in kp's network namespace", "sysctl", s.Name+"=1")
		}
	}
}

// AccountingLoaded reports whether the accounting sysctls exist in the
// calling thread's namespace: they do once the kernel's conntrack is
// loaded (by any NAT rule, kp's or another's).
func AccountingLoaded() bool {
	_, err := os.Stat(sysctlDir + "nf_conntrack_acct")
	return err == nil
}

// AccountingEnabled reports whether flows in the calling thread's
// namespace get packet and byte counters.
func AccountingEnabled() bool {
	b, err := os.ReadFile(sysctlDir + "nf_conntrack_acct")
	return err == nil && strings.TrimSpace(string(b)) == "1"
}

func ensureSysctl(path, want string) (bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return false, err
	}
	if strings.TrimSpace(string(b)) == want {
		return false, nil
	}
	if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	return true, nil
}
