package userspace

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"
)

// ip6tSOOriginalDst is IP6T_SO_ORIGINAL_DST (linux/netfilter_ipv6/ip6_tables.h),
// which golang.org/x/sys/unix does not name; it has SO_ORIGINAL_DST's value.
const ip6tSOOriginalDst = 80

// errNotRedirected is why a connection was refused: conntrack says its
// destination was not rewritten, so no redirect of kp's brought it.
var errNotRedirected = errors.New("not redirected")

// checkRedirected reports, through conntrack (getsockopt SO_ORIGINAL_DST,
// one system call per accepted connection), whether c reached the listener
// through a redirect: its original destination (a ClusterIP, a NodePort)
// differs from the listener's own address and port. A connection straight
// to <node IP>:<listener port> has its own address as original
// destination and gets errNotRedirected. This holds whatever the rules are:
// the listener filter (nftables set listeners, KP-USERSPACE-LISTENERS) is
// gone while an old userspace proxy drains after a switch, and is not yet
// written in the milliseconds between a new listener's bind and the sync's
// rule write.
//
// Any other error (ENOENT: no entry in the default conntrack zone, as when
// nothing in the namespace uses conntrack or the flow is tracked in another
// zone; ENOPROTOOPT: no nf_conntrack) is returned for the caller to let the
// connection through: the kernel's filter is the first line, this the
// second, and a proxy refusing every connection on a kernel quirk would be
// worse than the window it closes.
func checkRedirected(c *net.TCPConn) error {
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	local = netip.AddrPortFrom(local.Addr().Unmap(), local.Port())
	orig, err := originalDst(c, local.Addr().Is4())
	if err != nil {
		return err
	}
	if orig == local {
		return errNotRedirected
	}
	return nil
}

// originalDst is c's destination before NAT, as its conntrack entry holds
// it. v4 picks SOL_IP (also for an IPv4 connection on the dual-stack
// listener's IPv6 socket, which the kernel passes to IPv4's handler) or
// SOL_IPV6.
func originalDst(c *net.TCPConn, v4 bool) (netip.AddrPort, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var orig netip.AddrPort
	var serr error
	err = raw.Control(func(fd uintptr) {
		if v4 {
			// struct sockaddr_in (16 bytes) fits IPv6Mreq's 20.
			var m *unix.IPv6Mreq
			if m, serr = unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST); serr == nil {
				b := m.Multiaddr[:]
				orig = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), binary.BigEndian.Uint16(b[2:4]))
			}
			return
		}
		// struct sockaddr_in6 (28 bytes) is IPv6MTUInfo's first field.
		var m *unix.IPv6MTUInfo
		if m, serr = unix.GetsockoptIPv6MTUInfo(int(fd), unix.SOL_IPV6, ip6tSOOriginalDst); serr == nil {
			var port [2]byte // sin6_port, in network order, read as a native uint16
			binary.NativeEndian.PutUint16(port[:], m.Addr.Port)
			orig = netip.AddrPortFrom(netip.AddrFrom16(m.Addr.Addr).Unmap(), binary.BigEndian.Uint16(port[:]))
		}
	})
	return orig, errors.Join(err, serr)
}
