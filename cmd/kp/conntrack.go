package main

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/kpproxy/kp/cmd/kp/options"
	"github.com/kpproxy/kp/conntrack"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// tuneConntrack makes the node's conntrack settings of s, logging each
// change and each failure, and returns them for the status API.
func (a *app) tuneConntrack(s options.Settings) []statusapi.Sysctl {
	var out []statusapi.Sysctl
	for _, c := range a.tuner.Apply(s.Conntrack, a.log) {
		st := statusapi.Sysctl{Name: c.Name, Want: c.Want, Value: c.New}
		if c.Err != nil {
			st.Error = c.Err.Error()
		}
		out = append(out, st)
	}
	return out
}

// initNode does what needs a privileged process before kp proxy runs: kp
// sysctl's work, and kp proxy --init-only's (upstream's --init-only): the
// conntrack sysctls, flow accounting, and those of the proxy mode kp proxy
// will start in.
func (a *app) initNode(ctx context.Context, s options.Settings) {
	a.tuneConntrack(s)
	a.flowAccounting()
	a.initModeSysctls(ctx, s)
}

// flowAccounting turns on what kp proxy's conntrack cleaner turns on at
// its first run (conntrack.EnableAccounting: kp flows' and kp top's
// counters and ages), so that kp proxy, in a container whose /proc/sys is
// read-only, finds it on. Without it kp works and flows lack counters:
// a failure is logged as kp proxy logs it, not warned about.
func (a *app) flowAccounting() {
	for _, s := range conntrack.AccountingSysctls() {
		old, err := a.sysctls.Ensure(s.Name, "1")
		switch {
		case err != nil:
			a.log.Info("cannot turn on conntrack "+s.What+"; flows will lack them", "sysctl", s.Name, "err", err.Error())
		case old != "1":
			a.log.Info("turned on conntrack "+s.What, "sysctl", s.Name, "old", old, "new", "1")
		}
	}
}

func newSysctlCommand(a *app) *cobra.Command {
	o := &options.Options{}
	cmd := &cobra.Command{
		Use:   "sysctl",
		Short: "Set the node's sysctls as kp proxy would, then exit",
		Long: `Set the node's sysctls from the same flags and configuration file as 'kp proxy', then
exit: the conntrack sysctls (table size and timeouts), conntrack's per-flow counters and
timestamps (nf_conntrack_acct, nf_conntrack_timestamp: kp flows' and kp top's packet and
byte counts and ages), and those of the proxy mode kp proxy will start in (chosen as kp proxy chooses it: ipvs sets net.ipv4.vs.conntrack,
expire_nodest_conn, expire_quiescent_template, ip_forward and with strictARP arp_ignore
and arp_announce; iptables sets route_localnet when IPv4 NodePorts answer on 127.0.0.1).
kp proxy sets them itself at start when it can, and warns about each one it finds
wrong and cannot set; this command lets a privileged init container do it, so that the
long-running kp container needs no writable /proc/sys (see manifests/daemonset.yaml).
A setting that cannot be written is reported as a warning; the command fails only on
invalid flags or config.`,
		Example: `  # In the DaemonSet's init container, with the proxy's own configuration
  kp sysctl --config /var/lib/kp/config.conf

  # Leave the table size alone, set the CLOSE_WAIT timeout to 1h
  kp sysctl --conntrack-max-per-core 0 --conntrack-tcp-timeout-close-wait 1h`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := a.settings(cmd, o)
			if err != nil {
				return err
			}
			a.initNode(cmd.Context(), s)
			return nil
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}
