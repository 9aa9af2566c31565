package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpproxy/kp/conntrack"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// conntrackOptions are upstream's --conntrack-* flags: what kp proxy (and
// kp sysctl) set in the node's conntrack at start. 0 leaves the kernel's
// value, as upstream.
type conntrackOptions struct {
	maxPerCore, min              int32
	established, closeWait       time.Duration
	beLiberal                    bool
	udpTimeout, udpStreamTimeout time.Duration
}

func (c *conntrackOptions) addFlags(fs *pflag.FlagSet) {
	d := conntrack.DefaultTuning()
	fs.Int32Var(&c.maxPerCore, "conntrack-max-per-core", d.MaxPerCore,
		"Maximum number of NAT connections to track per CPU core (nf_conntrack_max = this × cores, at least --conntrack-min). 0 leaves the limit as is.")
	fs.Int32Var(&c.min, "conntrack-min", d.Min,
		"Minimum nf_conntrack_max, whatever the number of cores (see --conntrack-max-per-core).")
	fs.DurationVar(&c.established, "conntrack-tcp-timeout-established", d.TCPEstablishedTimeout,
		"Idle timeout of established TCP connections (nf_conntrack_tcp_timeout_established). 0 leaves it as is.")
	fs.DurationVar(&c.closeWait, "conntrack-tcp-timeout-close-wait", d.TCPCloseWaitTimeout,
		"How long a TCP connection stays tracked in CLOSE_WAIT (nf_conntrack_tcp_timeout_close_wait). 0 leaves it as is.")
	fs.BoolVar(&c.beLiberal, "conntrack-tcp-be-liberal", d.TCPBeLiberal,
		"Mark only out-of-window RST packets invalid, not every out-of-window packet (nf_conntrack_tcp_be_liberal=1).")
	fs.DurationVar(&c.udpTimeout, "conntrack-udp-timeout", d.UDPTimeout,
		"Idle timeout of UDP flows in the UNREPLIED state (nf_conntrack_udp_timeout). 0 leaves it as is.")
	fs.DurationVar(&c.udpStreamTimeout, "conntrack-udp-timeout-stream", d.UDPStreamTimeout,
		"Idle timeout of UDP flows in the ASSURED state (nf_conntrack_udp_timeout_stream). 0 leaves it as is.")
}

// apply overrides s.conntrack with every --conntrack-* flag set.
func (c *conntrackOptions) apply(fs *pflag.FlagSet, s *settings) []error {
	var errs []error
	ints := []struct {
		flag string
		val  int32
		dst  *int32
	}{
		{"conntrack-max-per-core", c.maxPerCore, &s.conntrack.MaxPerCore},
		{"conntrack-min", c.min, &s.conntrack.Min},
	}
	for _, f := range ints {
		if !fs.Changed(f.flag) {
			continue
		}
		if f.val < 0 {
			errs = append(errs, fmt.Errorf("--%s %d: must not be negative", f.flag, f.val))
		}
		*f.dst = f.val
	}
	durations := []struct {
		flag string
		val  time.Duration
		dst  *time.Duration
	}{
		{"conntrack-tcp-timeout-established", c.established, &s.conntrack.TCPEstablishedTimeout},
		{"conntrack-tcp-timeout-close-wait", c.closeWait, &s.conntrack.TCPCloseWaitTimeout},
		{"conntrack-udp-timeout", c.udpTimeout, &s.conntrack.UDPTimeout},
		{"conntrack-udp-timeout-stream", c.udpStreamTimeout, &s.conntrack.UDPStreamTimeout},
	}
	for _, f := range durations {
		if !fs.Changed(f.flag) {
			continue
		}
		if err := checkConntrackTimeout(f.val); err != nil {
			errs = append(errs, fmt.Errorf("--%s %s: %w", f.flag, f.val, err))
		}
		*f.dst = f.val
	}
	if fs.Changed("conntrack-tcp-be-liberal") {
		s.conntrack.TCPBeLiberal = c.beLiberal
	}
	return errs
}

// applyConntrackSection reads KubeProxyConfiguration's conntrack: section
// (nil fields and zero durations keep the defaults, as upstream's
// defaulting does).
func applyConntrackSection(ct KubeProxyConntrackConfiguration, s *settings) []error {
	var errs []error
	invalid := func(field string, value any, err error) {
		errs = append(errs, fmt.Errorf("conntrack.%s %v: %w", field, value, err))
	}
	if ct.MaxPerCore != nil {
		if *ct.MaxPerCore < 0 {
			invalid("maxPerCore", *ct.MaxPerCore, errors.New("must not be negative"))
		}
		s.conntrack.MaxPerCore = *ct.MaxPerCore
	}
	if ct.Min != nil {
		if *ct.Min < 0 {
			invalid("min", *ct.Min, errors.New("must not be negative"))
		}
		s.conntrack.Min = *ct.Min
	}
	durations := []struct {
		field string
		set   bool
		val   time.Duration
		dst   *time.Duration
	}{
		{"tcpEstablishedTimeout", ct.TCPEstablishedTimeout != nil, durationOf(ct.TCPEstablishedTimeout), &s.conntrack.TCPEstablishedTimeout},
		{"tcpCloseWaitTimeout", ct.TCPCloseWaitTimeout != nil, durationOf(ct.TCPCloseWaitTimeout), &s.conntrack.TCPCloseWaitTimeout},
		{"udpTimeout", ct.UDPTimeout.Duration != 0, ct.UDPTimeout.Duration, &s.conntrack.UDPTimeout},
		{"udpStreamTimeout", ct.UDPStreamTimeout.Duration != 0, ct.UDPStreamTimeout.Duration, &s.conntrack.UDPStreamTimeout},
	}
	for _, d := range durations {
		if !d.set {
			continue
		}
		if err := checkConntrackTimeout(d.val); err != nil {
			invalid(d.field, d.val, err)
		}
		*d.dst = d.val
	}
	if ct.TCPBeLiberal {
		s.conntrack.TCPBeLiberal = true
	}
	return errs
}

func checkConntrackTimeout(d time.Duration) error {
	switch {
	case d < 0:
		return errors.New("must not be negative")
	case d > 0 && d < time.Second:
		return errors.New("must be 0 (leave the kernel's value) or at least 1s: the kernel counts seconds")
	}
	return nil
}

// tuneConntrack makes the node's conntrack settings of s, logging each
// change and each failure, and returns them for the status API.
func (a *app) tuneConntrack(s settings) []statusapi.Sysctl {
	var out []statusapi.Sysctl
	for _, c := range a.tuner.Apply(s.conntrack, a.log) {
		st := statusapi.Sysctl{Name: c.Name, Want: c.Want, Value: c.New}
		if c.Err != nil {
			st.Error = c.Err.Error()
		}
		out = append(out, st)
	}
	return out
}

func newSysctlCommand(a *app) *cobra.Command {
	o := &proxyOptions{}
	cmd := &cobra.Command{
		Use:   "sysctl",
		Short: "Set the node's conntrack sysctls as kp proxy would, then exit",
		Long: `Set the node's conntrack sysctls (table size and timeouts) from the same flags and
configuration file as 'kp proxy', then exit. kp proxy sets them itself at start; this
command lets a privileged init container do it, so that the long-running kp container
needs no writable /proc/sys (see manifests/daemonset.yaml). A setting that cannot be
written is reported as a warning; the command fails only on invalid flags or config.`,
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
			a.tuneConntrack(s)
			return nil
		},
	}
	o.addFlags(cmd.Flags())
	return cmd
}

func durationOf(d *metav1.Duration) time.Duration {
	if d == nil {
		return 0
	}
	return d.Duration
}
