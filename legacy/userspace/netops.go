package userspace

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/kpproxy/kp/conntrack"
	"github.com/kpproxy/kp/internal/nftgen"
	"github.com/kpproxy/kp/internal/nsenter"
)

// netOps opens sockets and netlink connections: in the process's network
// namespace, or (tests) in another.
type netOps struct {
	listenTCP func() (*net.TCPListener, error)
	listenUDP func() ([]*net.UDPConn, error)
	dial      func(ctx context.Context, network, addr string) (net.Conn, error)
	nft       func(opts ...nftables.ConnOption) (*nftables.Conn, error)
	// nftGen opens a reader of the nftables ruleset's generation.
	nftGen func() (*nftgen.Reader, error)
	// inNS runs fn in the namespace (iptables binaries run in the calling
	// thread's).
	inNS func(fn func() error) error
	// routeDev names the interface the namespace routes a to.
	routeDev func(a netip.Addr) (string, error)
	// redirected asks conntrack whether an accepted connection came
	// through a redirect (checkRedirected; the socket knows its own
	// namespace).
	redirected func(c *net.TCPConn) error
	// conntrack opens the namespace's conntrack table (handover.go).
	conntrack func() (conntrack.Conn, error)
}

// hostOps opens everything in the process's own network namespace.
func hostOps() netOps {
	return netOps{
		listenTCP:  listenTCP,
		listenUDP:  listenUDP,
		dial:       (&net.Dialer{}).DialContext,
		nft:        func(opts ...nftables.ConnOption) (*nftables.Conn, error) { return nftables.New(opts...) },
		nftGen:     func() (*nftgen.Reader, error) { return nftgen.Open(0) },
		inNS:       func(fn func() error) error { return fn() },
		routeDev:   routeDev,
		redirected: checkRedirected,
		conntrack:  conntrack.Dialer{}.Open,
	}
}

// routeDev names the interface the calling thread's namespace routes a to.
func routeDev(a netip.Addr) (string, error) {
	routes, err := netlink.RouteGet(a.AsSlice())
	if err != nil {
		return "", err
	}
	if len(routes) == 0 {
		return "", fmt.Errorf("no route to %s", a)
	}
	link, err := netlink.LinkByIndex(routes[0].LinkIndex)
	if err != nil {
		return "", err
	}
	return link.Attrs().Name, nil
}

// NamespaceOps opens everything inside the network namespace ns (tests
// that run the backend in-process against a namespace's kernel).
func NamespaceOps(ns netns.NsHandle) Option {
	return WithNetOps(netOps{
		listenTCP: func() (ln *net.TCPListener, err error) {
			err = nsenter.Run(ns, func() error { ln, err = listenTCP(); return err })
			return ln, err
		},
		listenUDP: func() (s []*net.UDPConn, err error) {
			err = nsenter.Run(ns, func() error { s, err = listenUDP(); return err })
			return s, err
		},
		dial: nsenter.DialContext(ns),
		nft: func(opts ...nftables.ConnOption) (*nftables.Conn, error) {
			return nftables.New(append([]nftables.ConnOption{nftables.WithNetNSFd(int(ns))}, opts...)...)
		},
		nftGen: func() (*nftgen.Reader, error) { return nftgen.Open(int(ns)) },
		inNS:   func(fn func() error) error { return nsenter.Run(ns, fn) },
		routeDev: func(a netip.Addr) (dev string, err error) {
			err = nsenter.Run(ns, func() error { dev, err = routeDev(a); return err })
			return dev, err
		},
		redirected: checkRedirected,
		conntrack:  conntrack.Dialer{NetNS: int(ns)}.Open,
	})
}

// listenTCP opens a dual-stack listener on a port the kernel picks.
func listenTCP() (*net.TCPListener, error) {
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		return nil, err
	}
	return ln.(*net.TCPListener), nil
}

// listenUDP opens an IPv4 socket on a port the kernel picks and an IPv6
// one on the same port (a separate socket, because the destination of a
// datagram is read per family: IP_PKTINFO, IPV6_PKTINFO). IPv6 is left out
// when the node has none.
func listenUDP() ([]*net.UDPConn, error) {
	c4, err := net.ListenUDP("udp4", &net.UDPAddr{})
	if err != nil {
		return nil, err
	}
	if err := enablePktInfo(c4, false); err != nil {
		c4.Close()
		return nil, fmt.Errorf("IP_PKTINFO: %w", err)
	}
	port := c4.LocalAddr().(*net.UDPAddr).Port
	c6, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6unspecified, Port: port})
	if err != nil {
		if isFDExhausted(err) {
			c4.Close()
			return nil, err
		}
		slog.Debug("no IPv6 UDP listener", "port", port, "err", err)
		return []*net.UDPConn{c4}, nil
	}
	if err := enablePktInfo(c6, true); err != nil {
		c4.Close()
		c6.Close()
		return nil, fmt.Errorf("IPV6_RECVPKTINFO: %w", err)
	}
	return []*net.UDPConn{c4, c6}, nil
}
