package userspace

import (
	"fmt"
	"log/slog"
	"net"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kpproxy/kp/internal/nsenter"
)

// hostOps opens everything in the process's own network namespace.
func hostOps() netOps {
	return netOps{
		listenTCP: listenTCP,
		listenUDP: listenUDP,
		dial:      (&net.Dialer{}).DialContext,
		nft:       func(opts ...nftables.ConnOption) (*nftables.Conn, error) { return nftables.New(opts...) },
		inNS:      func(fn func() error) error { return fn() },
	}
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
		inNS: func(fn func() error) error { return nsenter.Run(ns, fn) },
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

// applyProbe writes a redirect rule into table t and deletes t in the same
// transaction, so nothing is left behind whatever the outcome.
func applyProbe(conn *nftables.Conn, t *nftables.Table) error {
	c := conn.AddChain(&nftables.Chain{Name: "probe", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest})
	conn.AddRule(&nftables.Rule{Table: t, Chain: c, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(1)},
		&expr.Redir{RegisterProtoMin: 1},
	}})
	conn.DelTable(t)
	return conn.Flush()
}
