package main

import (
	"context"

	"github.com/kpproxy/kp/cmd/kp/options"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// fixModeSysctl is what an operator does about a sysctl the proxy mode
// needs that kp proxy cannot set (a container without privileges has a
// read-only /proc/sys).
const fixModeSysctl = "run kp sysctl with kp proxy's config before kp proxy starts " +
	"(the DaemonSet's privileged init container does: manifests/daemonset.yaml), or set it on the node"

// initModeSysctls is the init step's part for the proxy mode: the mode kp
// proxy will start in, chosen as it chooses (startBackend: the configured
// mode, or auto's first mode that runs), and that mode's sysctls set.
func (a *app) initModeSysctls(ctx context.Context, s options.Settings) {
	_, b, _, err := a.startBackend(ctx, s)
	if err != nil {
		a.log.Warn("cannot tell which proxy mode kp proxy will start in; its sysctls are left to it", "err", err)
		return
	}
	a.modeSysctls(b)
}

// modeSysctls sets the sysctls backend's mode needs (proxy.SysctlNeeder,
// the list the backend itself sets) unless they have their values: the
// init step's work, and kp proxy's check at start. Each change is logged;
// a sysctl with another value that cannot be set is one warning naming
// it, its value, the value the mode needs and how to fix it. It returns
// them for the status API.
func (a *app) modeSysctls(b proxy.Backend) []statusapi.Sysctl {
	n, ok := b.(proxy.SysctlNeeder)
	if !ok {
		return nil
	}
	var out []statusapi.Sysctl
	for _, s := range n.Sysctls() {
		old, err := a.sysctls.Ensure(s.Name, s.Value)
		st := statusapi.Sysctl{Name: s.Name, Want: s.Value, Value: s.Value}
		switch {
		case err != nil:
			st.Value, st.Error = old, err.Error()
			if old == "" {
				old = "unreadable"
			}
			a.log.Warn("a sysctl the proxy mode needs is not set and kp cannot set it", "mode", b.Mode(),
				"sysctl", s.Name, "value", old, "want", s.Value, "needed", s.Why, "error", err.Error(), "fix", fixModeSysctl)
		case old != s.Value:
			a.log.Info("set a sysctl the proxy mode needs", "mode", b.Mode(), "sysctl", s.Name, "old", old, "new", s.Value)
		default:
			a.log.Debug("a sysctl the proxy mode needs is set", "mode", b.Mode(), "sysctl", s.Name, "value", s.Value)
		}
		out = append(out, st)
	}
	return out
}
