package userspace

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/kpproxy/kp/internal/nlsock"
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
	// stamp is a cheap sign of change of f's rules in the kernel (drift.go):
	// equal stamps mean nothing changed in between.
	stamp(f proxy.Family) (stamp, error)
	// drifted lists how f's rules in the kernel differ from rules, as the
	// last write of f wrote them; none when they do not.
	drifted(ctx context.Context, f proxy.Family, rules Rules) ([]string, error)
}

// nftRedirector is the table ip/ip6 kp-userspace; wrote records what its
// writes put there, for the drift check.
type nftRedirector struct {
	ops   *netOps
	wrote *nftWritten
}

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

func (r nftRedirector) write(_ context.Context, f proxy.Family, rules Rules) error {
	// One transaction of every element: the socket must hold it.
	ops := len(rules.Redirects) + len(rules.Rejects) + len(rules.Drops) + len(rules.Listeners) + 64
	conn, err := r.ops.nft(nftables.WithSockOptions(batchBuffers(ops)))
	if err != nil {
		return fmt.Errorf("open netlink: %w", err)
	}
	defer conn.CloseLasting()
	counts, err := applyRules(conn, f, rules)
	if err == nil {
		r.wrote.set(f, counts)
	}
	return err
}

// batchBuffers sizes the netlink socket for a transaction of ops
// messages (nlsock.Buffers): 1,024 bytes an operation bounds an element
// with its comment, and the kernel's accounting of an error it sends back;
// the default 212 kB held about 1,500 Services' elements.
func batchBuffers(ops int) nftables.SockOption { return nlsock.Buffers(ops, ops*1024, ops*1024) }

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
	nft := nftRedirector{ops: &b.ops, wrote: &nftWritten{}}
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
