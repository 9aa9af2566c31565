package cluster

import (
	"context"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy/statusapi"
)

// KPReader reads a kp pod's own view of its node (PodExec through the API
// server; a fake in tests).
type KPReader interface {
	Status(ctx context.Context, pod *v1.Pod) (*statusapi.Status, error)
	Inventory(ctx context.Context, pod *v1.Pod) (*statusapi.Inventory, error)
}

// satisfies says whether mode, as kp reports it (iptables with its
// flavor), is want: "iptables" takes either flavor, "iptables-nft" only
// that one.
func satisfies(st *statusapi.Status, want string) bool {
	got := st.Mode
	if st.Mode == "iptables" && st.IPTablesBackend != "" {
		got = "iptables-" + st.IPTablesBackend
	}
	if want == "iptables" {
		return st.Mode == "iptables"
	}
	return got == want
}

// running is the mode kp reports, as a target's spelling.
func running(st *statusapi.Status) string {
	if st.Mode == "iptables" && st.IPTablesBackend != "" {
		return "iptables-" + st.IPTablesBackend
	}
	return st.Mode
}

// synced says why st is not yet kp healthy and synced in want ("" when it
// is; want "" takes any mode but none). afterID >= 0 requires a mode
// switch newer than afterID to have succeeded, and a sync after it; -1
// takes kp's state as it is.
func synced(st *statusapi.Status, want string, afterID int64) (string, error) {
	m := st.Migration
	if afterID >= 0 && m != nil && int64(m.ID) > afterID && m.Phase == statusapi.MigrationFailed {
		return "", fmt.Errorf("kp's switch to %s failed%s: %s", m.To, failedStep(m), m.Error)
	}
	switch {
	case want == "" && st.Mode == ModeNone:
		return "kp runs mode none", nil
	case want != "" && !satisfies(st, want):
		return fmt.Sprintf("kp runs %s, not %s yet", running(st), want), nil
	case !st.Healthy:
		return fmt.Sprintf("kp runs %s but is not healthy", running(st)), nil
	case st.LastSync == nil:
		return fmt.Sprintf("kp runs %s but has not synced yet", running(st)), nil
	}
	if afterID >= 0 {
		if m == nil || int64(m.ID) <= afterID {
			return fmt.Sprintf("kp runs %s; its switch has not started", running(st)), nil
		}
		if m.Phase != statusapi.MigrationSucceeded {
			return fmt.Sprintf("kp's switch to %s is %s", m.To, m.Phase), nil
		}
		if st.LastSync.Time.Before(m.Ended) {
			return fmt.Sprintf("kp switched to %s; no sync since", m.To), nil
		}
	}
	return "", nil
}

func failedStep(m *statusapi.Migration) string {
	for _, s := range m.Steps {
		if s.Error != "" {
			return " at its " + s.Name + " step"
		}
	}
	return ""
}

// programsOf lists inv's programs of owner, as a phrase ("" when none).
func programsOf(inv *statusapi.Inventory, owner string) string {
	var out []string
	for _, p := range inv.Programs {
		if p.Owner == owner {
			out = append(out, fmt.Sprintf("%s %s in %s (%d chains, %d rules)", p.Owner, p.Mode, p.Where, p.Chains, p.Rules))
		}
	}
	return strings.Join(out, "; ")
}

// kubeProxyServes says whether inv lists kube-proxy's rules for at least
// servicePorts service ports: its first sync went in (kube-proxy writes a
// table's chains in one iptables-restore, one commit; in nftables mode one
// transaction), each service port adds at least one rule or element.
func kubeProxyServes(inv *statusapi.Inventory, servicePorts int) bool {
	n := 0
	for _, p := range inv.Programs {
		if p.Owner == "kube-proxy" {
			n += p.Rules + p.Elements
		}
	}
	return n > 0 && n >= servicePorts
}
