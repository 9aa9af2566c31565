package userspace

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/kpproxy/kp/legacy/iptables"
	"github.com/kpproxy/kp/proxy"
)

// Redirect methods (--userspace-redirect).
const (
	RedirectAuto     = "auto"
	RedirectNFTables = "nftables"
	RedirectIPTables = "iptables"
)

// ParseRedirect checks a --userspace-redirect value.
func ParseRedirect(s string) (string, error) {
	switch s {
	case "", RedirectAuto:
		return RedirectAuto, nil
	case RedirectNFTables, RedirectIPTables:
		return s, nil
	}
	return "", fmt.Errorf("userspace redirect %q: want auto, nftables or iptables", s)
}

// redirector writes the redirect rules (Rules) of one family into the
// kernel: an nftables table of kp's own, or iptables chains of kp's own.
type redirector interface {
	String() string
	// families are the families it programs (after probe).
	families() []proxy.Family
	probe(ctx context.Context) error
	write(ctx context.Context, f proxy.Family, rules Rules) error
}

// nftRedirector is the table ip/ip6 kp-userspace.
type nftRedirector struct{ ops *netOps }

func (r nftRedirector) String() string           { return RedirectNFTables }
func (r nftRedirector) families() []proxy.Family { return []proxy.Family{proxy.IPv4, proxy.IPv6} }

// probe writes a redirect rule in a throwaway table and deletes it in the
// same transaction.
func (r nftRedirector) probe(context.Context) error {
	conn, err := r.ops.nft()
	if err != nil {
		return fmt.Errorf("open netlink: %w", err)
	}
	defer conn.CloseLasting()
	t := conn.AddTable(&nftables.Table{Name: "kp-userspace-probe", Family: nftables.TableFamilyIPv4})
	if err := applyProbe(conn, t); err != nil {
		return fmt.Errorf("the kernel refused an nftables redirect (nf_tables with nat is required): %w", err)
	}
	return nil
}

func (r nftRedirector) write(_ context.Context, f proxy.Family, rules Rules) error {
	// One transaction of every element: the socket must hold it.
	ops := len(rules.Redirects) + len(rules.Rejects) + len(rules.Drops) + 64
	conn, err := r.ops.nft(nftables.WithSockOptions(batchBuffers(ops)))
	if err != nil {
		return fmt.Errorf("open netlink: %w", err)
	}
	defer conn.CloseLasting()
	return applyRules(conn, f, rules)
}

// Per-operation allowances for batchBuffers: a generous bound on one
// message's bytes (an element with its comment) and on the kernel's
// accounting of an error it sends back.
const (
	sndBytesPerOp = 1024
	rcvBytesPerOp = 1024
	minSockBuffer = 1 << 20
	maxSockBuffer = 1<<31 - 1
)

// batchBuffers sizes the netlink socket for a transaction of ops
// messages: google/nftables sends a transaction in one sendmsg, which the
// kernel refuses (EMSGSIZE) beyond the send buffer (212 kB by default:
// about 1,500 Services' elements with their comments). The *FORCE options
// need CAP_NET_ADMIN, which kp has; they set limits, not allocations.
func batchBuffers(ops int) nftables.SockOption {
	size := func(per int) int { return min(max(ops*per, minSockBuffer), maxSockBuffer) }
	return func(conn *netlink.Conn) error {
		raw, err := conn.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		err = raw.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, size(sndBytesPerOp))
			if serr == nil {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, size(rcvBytesPerOp))
			}
		})
		if err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("size the netlink socket for %d operations: %w", ops, serr)
		}
		return nil
	}
}

// cleanupNFT removes the kp-userspace tables. A kernel without nf_tables
// holds none: that is not an error.
func cleanupNFT(ops *netOps) error {
	conn, err := ops.nft()
	if isNoNFTables(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open netlink: %w", err)
	}
	defer conn.CloseLasting()
	err = deleteTables(conn)
	if isNoNFTables(err) {
		return nil
	}
	return err
}

// chooseRedirector probes the redirect method the configuration asks
// for; auto takes nftables when the kernel runs it, else iptables.
func (b *Backend) chooseRedirector(ctx context.Context) (redirector, error) {
	nft := nftRedirector{ops: &b.ops}
	ipt := &iptRedirector{cfg: b.cfg, log: b.log, ops: &b.ops}
	switch b.cfg.UserspaceRedirect {
	case RedirectNFTables:
		if err := nft.probe(ctx); err != nil {
			return nil, fmt.Errorf("userspace probe (--userspace-redirect nftables): %w", err)
		}
		return nft, nil
	case RedirectIPTables:
		if err := ipt.probe(ctx); err != nil {
			return nil, fmt.Errorf("userspace probe (--userspace-redirect iptables): %w", err)
		}
		return ipt, nil
	}
	nftErr := nft.probe(ctx)
	if nftErr == nil {
		return nft, nil
	}
	b.log.Warn("the userspace mode cannot redirect with nftables; trying iptables REDIRECT", "err", nftErr)
	if err := ipt.probe(ctx); err != nil {
		return nil, fmt.Errorf("userspace probe: neither nftables nor iptables can redirect: %w",
			errors.Join(fmt.Errorf("nftables: %w", nftErr), fmt.Errorf("iptables: %w", err)))
	}
	return ipt, nil
}

// cleanupIPTables removes the KP-USERSPACE- chains (both iptables
// flavors and families), running the binaries in the backend's namespace.
func cleanupIPTables(ctx context.Context, ops *netOps, log *slog.Logger) error {
	return ops.inNS(func() error {
		_, err := iptables.CleanupOwned(ctx, log, iptables.UserspaceChainPrefix)
		return err
	})
}

// isNoNFTables reports an error of a kernel without nf_tables.
func isNoNFTables(err error) bool {
	return errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.EAFNOSUPPORT)
}
