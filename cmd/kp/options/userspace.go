package options

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/pflag"

	"github.com/kpproxy/kp/legacy/userspace"
)

// The userspace mode's defaults. The connection cap bounds the file
// descriptors one Service can take (two per connection) well below a
// raised RLIMIT_NOFILE; the TCP idle timeout is conntrack's for an
// established connection (nf_conntrack_tcp_timeout_established, 5 days
// in the kernel, 1 day as kube-proxy sets it), so a connection that would
// live through the other modes lives through this one; UDP sessions end
// after 30 s of silence (DNS needs far less, and conntrack keeps a
// replied UDP flow 120 s).
const (
	defaultUserspaceMaxConnections = 10000
	defaultUserspaceTCPIdleTimeout = 24 * time.Hour
	defaultUserspaceUDPIdleTimeout = 30 * time.Second
)

// userspaceOptions are kp's flags for the userspace mode (upstream removed
// the mode, and with it its flags).
type userspaceOptions struct {
	redirect       string
	maxConnections int
	tcpIdleTimeout time.Duration
	udpIdleTimeout time.Duration
}

func (u *userspaceOptions) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&u.redirect, "userspace-redirect", userspace.RedirectAuto,
		"kp only: how the userspace mode sends Service traffic to its listeners: nftables (a table kp-userspace), "+
			"iptables (REDIRECT rules in KP-USERSPACE- chains, with the backend --iptables-backend chooses), "+
			"or auto for nftables when the kernel runs it, else iptables.")
	fs.IntVar(&u.maxConnections, "userspace-max-connections", defaultUserspaceMaxConnections,
		"kp only: the most TCP connections the userspace mode proxies at once per service port; past it new "+
			"connections are reset at once and counted in kp_userspace_refused_connections_total. 0 for no cap.")
	fs.DurationVar(&u.tcpIdleTimeout, "userspace-tcp-idle-timeout", defaultUserspaceTCPIdleTimeout,
		"kp only: the userspace mode closes a proxied TCP connection that carried nothing either way for this long. 0 for never.")
	fs.DurationVar(&u.udpIdleTimeout, "userspace-udp-idle-timeout", defaultUserspaceUDPIdleTimeout,
		"kp only: the userspace mode ends a UDP session (one client address and port) that carried nothing either way "+
			"for this long. Must be greater than 0.")
}

func (u *userspaceOptions) apply(changed func(string) bool, s *Settings) []error {
	var errs []error
	fail := func(flag, value string, err error) {
		errs = append(errs, fmt.Errorf("--%s %q: %w", flag, value, err))
	}
	if changed("userspace-redirect") {
		r, err := userspace.ParseRedirect(u.redirect)
		if err != nil {
			fail("userspace-redirect", u.redirect, errors.New("want auto, nftables or iptables"))
		}
		s.Config.UserspaceRedirect = r
	}
	if changed("userspace-max-connections") {
		if u.maxConnections < 0 {
			fail("userspace-max-connections", strconv.Itoa(u.maxConnections), errors.New("must not be negative"))
		}
		s.Config.UserspaceMaxConnections = u.maxConnections
	}
	if changed("userspace-tcp-idle-timeout") {
		if err := checkDuration(u.tcpIdleTimeout, true); err != nil {
			fail("userspace-tcp-idle-timeout", u.tcpIdleTimeout.String(), err)
		}
		s.Config.UserspaceTCPIdleTimeout = u.tcpIdleTimeout
	}
	if changed("userspace-udp-idle-timeout") {
		if err := checkDuration(u.udpIdleTimeout, false); err != nil {
			fail("userspace-udp-idle-timeout", u.udpIdleTimeout.String(), err)
		}
		s.Config.UserspaceUDPIdleTimeout = u.udpIdleTimeout
	}
	return errs
}
