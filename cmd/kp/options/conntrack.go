package options

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpproxy/kp/conntrack"
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

// apply overrides s.Conntrack with every --conntrack-* flag set.
func (c *conntrackOptions) apply(changed func(string) bool, s *Settings) []error {
	var errs []error
	ints := []struct {
		flag string
		val  int32
		dst  *int32
	}{
		{"conntrack-max-per-core", c.maxPerCore, &s.Conntrack.MaxPerCore},
		{"conntrack-min", c.min, &s.Conntrack.Min},
	}
	for _, f := range ints {
		if !changed(f.flag) {
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
		{"conntrack-tcp-timeout-established", c.established, &s.Conntrack.TCPEstablishedTimeout},
		{"conntrack-tcp-timeout-close-wait", c.closeWait, &s.Conntrack.TCPCloseWaitTimeout},
		{"conntrack-udp-timeout", c.udpTimeout, &s.Conntrack.UDPTimeout},
		{"conntrack-udp-timeout-stream", c.udpStreamTimeout, &s.Conntrack.UDPStreamTimeout},
	}
	for _, f := range durations {
		if !changed(f.flag) {
			continue
		}
		if err := checkConntrackTimeout(f.val); err != nil {
			errs = append(errs, fmt.Errorf("--%s %s: %w", f.flag, f.val, err))
		}
		*f.dst = f.val
	}
	if changed("conntrack-tcp-be-liberal") {
		s.Conntrack.TCPBeLiberal = c.beLiberal
	}
	return errs
}

// applyConntrackSection reads KubeProxyConfiguration's conntrack: section
// (nil fields and zero durations keep the defaults, as upstream's
// defaulting does).
func applyConntrackSection(ct KubeProxyConntrackConfiguration, s *Settings) []error {
	var errs []error
	invalid := func(field string, value any, err error) {
		errs = append(errs, fmt.Errorf("conntrack.%s %v: %w", field, value, err))
	}
	if ct.MaxPerCore != nil {
		if *ct.MaxPerCore < 0 {
			invalid("maxPerCore", *ct.MaxPerCore, errors.New("must not be negative"))
		}
		s.Conntrack.MaxPerCore = *ct.MaxPerCore
	}
	if ct.Min != nil {
		if *ct.Min < 0 {
			invalid("min", *ct.Min, errors.New("must not be negative"))
		}
		s.Conntrack.Min = *ct.Min
	}
	durations := []struct {
		field string
		set   bool
		val   time.Duration
		dst   *time.Duration
	}{
		{"tcpEstablishedTimeout", ct.TCPEstablishedTimeout != nil, durationOf(ct.TCPEstablishedTimeout), &s.Conntrack.TCPEstablishedTimeout},
		{"tcpCloseWaitTimeout", ct.TCPCloseWaitTimeout != nil, durationOf(ct.TCPCloseWaitTimeout), &s.Conntrack.TCPCloseWaitTimeout},
		{"udpTimeout", ct.UDPTimeout.Duration != 0, ct.UDPTimeout.Duration, &s.Conntrack.UDPTimeout},
		{"udpStreamTimeout", ct.UDPStreamTimeout.Duration != 0, ct.UDPStreamTimeout.Duration, &s.Conntrack.UDPStreamTimeout},
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
		s.Conntrack.TCPBeLiberal = true
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

func durationOf(d *metav1.Duration) time.Duration {
	if d == nil {
		return 0
	}
	return d.Duration
}
