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

// EnableAccounting turns on per-flow packet and byte counters
// (nf_conntrack_acct) and creation timestamps (nf_conntrack_timestamp) in
// the calling process's network namespace, where kp runs, and logs what it
// turned on. Both are per-namespace and only apply to entries created
// afterwards. It cannot fail kp: a sysctl it cannot write (a read-only
// /proc/sys in a container) is logged and flows simply lack counters.
func EnableAccounting(log *slog.Logger) {
	for _, s := range []struct{ name, what string }{
		{"nf_conntrack_acct", "per-flow packet and byte counters"},
		{"nf_conntrack_timestamp", "per-flow start times"},
	} {
		changed, err := ensureSysctl(sysctlDir+s.name, "1")
		switch {
		case err != nil:
			log.Info("cannot turn on conntrack "+s.what+"; flows will lack them", "sysctl", "net.netfilter."+s.name, "err", err)
		case changed:
			log.Info("turned on conntrack "+s.what+" in kp's network namespace", "sysctl", "net.netfilter."+s.name+"=1")
		}
	}
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
