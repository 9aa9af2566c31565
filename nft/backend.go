// Package nft is kp's default backend: it renders a proxy.State into one
// nftables table per IP family (ip kp, ip6 kp) and applies only the
// difference against what it knows is in the kernel, atomically, in one
// netlink batch per sync.
package nft

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/kpproxy/kp/proxy"
)

// fullSyncInterval bounds how long kp trusts its own record of the kernel:
// past it, a sync re-reads the tables and repairs anything changed behind
// kp's back.
const fullSyncInterval = time.Hour

// Backend is the nftables mode.
type Backend struct {
	cfg      proxy.Config
	log      *slog.Logger
	conn     Conn
	masqMark uint32
	now      func() time.Time
	// localAddrs lists this namespace's addresses (for --nodeport-addresses).
	localAddrs   func() ([]netip.Addr, error)
	defaultAddrs func() ([]netip.Addr, error)
	probeNsFd    int

	// model is what kp knows is in each table; nil means unknown (start,
	// or after a failed transaction): the next sync reads the kernel.
	model map[family]*tableState
	// owned holds each service port's objects as last written, per family.
	owned    map[family]map[proxy.ServicePortName]*view
	skel     map[family]*view
	lastFull time.Time

	lastNodePortIPs []netip.Addr

	// LastTransaction is the size of the last applied batch, for metrics
	// and tests.
	lastOps int
}

// New returns the nftables backend for cfg, acting in the calling process's
// network namespace.
func New(cfg proxy.Config, log *slog.Logger) (*Backend, error) {
	return newBackend(cfg, log, &netlinkConn{})
}

// NewInNamespace returns the nftables backend acting in the network
// namespace that nsFd refers to (an open /run/netns/NAME, for instance).
func NewInNamespace(cfg proxy.Config, log *slog.Logger, nsFd int) (*Backend, error) {
	b, err := newBackend(cfg, log, &netlinkConn{nsFd: nsFd})
	if err != nil {
		return nil, err
	}
	b.localAddrs = func() ([]netip.Addr, error) { return listLocalAddrsIn(nsFd) }
	b.defaultAddrs = func() ([]netip.Addr, error) { return defaultRouteAddrsIn(nsFd) }
	b.probeNsFd = nsFd
	return b, nil
}

func newBackend(cfg proxy.Config, log *slog.Logger, conn Conn) (*Backend, error) {
	if cfg.MasqueradeBit < 0 || cfg.MasqueradeBit > 31 {
		return nil, fmt.Errorf("masquerade bit %d: must be within 0..31", cfg.MasqueradeBit)
	}
	if log == nil {
		log = slog.Default()
	}
	return &Backend{
		cfg: cfg, log: log, conn: conn,
		masqMark:     1 << uint(cfg.MasqueradeBit),
		now:          time.Now,
		localAddrs:   func() ([]netip.Addr, error) { return listLocalAddrsIn(0) },
		defaultAddrs: func() ([]netip.Addr, error) { return defaultRouteAddrsIn(0) },
	}, nil
}

func (b *Backend) Mode() proxy.Mode { return proxy.ModeNFTables }

// LastTransactionOps is the number of operations in the last applied batch.
func (b *Backend) LastTransactionOps() int { return b.lastOps }

// Sync makes kp's tables match s in one transaction. After a successful
// sync only s.Changed is rendered; a full reconcile happens at start, after
// a failure, when the Node changed, and every fullSyncInterval.
func (b *Backend) Sync(ctx context.Context, s *proxy.State) error {
	full := b.model == nil || s.NodeChanged || b.now().Sub(b.lastFull) > fullSyncInterval
	if b.model == nil {
		b.model = map[family]*tableState{}
		b.owned = map[family]map[proxy.ServicePortName]*view{}
		b.skel = map[family]*view{}
	}
	npIPs, err := b.nodePortIPs(s)
	if err != nil {
		b.log.Warn("cannot list node addresses for NodePorts; keeping the previous ones", "err", err)
		npIPs = b.lastNodePortIPs
	}
	tx := &Transaction{}
	newOwned := map[family]map[proxy.ServicePortName]*view{}
	newSkel := map[family]*view{}
	for _, f := range families {
		model := b.model[f]
		if model == nil {
			var err error
			if model, err = b.conn.Read(f); err != nil {
				b.model = nil
				return fmt.Errorf("read %s %s: %w", f.name, TableName, err)
			}
			if model == nil {
				tx.addTable(f)
				model = newTableState()
			}
			b.model[f] = model
			full = true
		}
		skel := b.skeleton(f, proxy.FilterAddrs(f.pf, npIPs), proxy.FilterPrefixes(f.pf, b.cfg.ClusterCIDRs))
		newSkel[f] = skel
		if full {
			want := newView()
			want.merge(skel)
			owned := map[proxy.ServicePortName]*view{}
			for name, sp := range s.Services {
				v := b.render(f, sp, s.Endpoints[name])
				owned[name] = v
				want.merge(v)
			}
			scope := modelView(model)
			scope.merge(want)
			diff(tx, f, model, want, scope)
			newOwned[f] = owned
			continue
		}
		scope := newView()
		scope.merge(b.skel[f])
		scope.merge(skel)
		diff(tx, f, model, skel, scope)
		owned := b.owned[f]
		for name := range s.Changed {
			old := owned[name]
			var v *view
			if sp := s.Services[name]; sp != nil {
				v = b.render(f, sp, s.Endpoints[name])
			} else {
				v = newView()
			}
			scope := newView()
			scope.merge(old)
			scope.merge(v)
			diff(tx, f, model, v, scope)
			if s.Services[name] != nil {
				owned[name] = v
			} else {
				delete(owned, name)
			}
		}
		newOwned[f] = owned
	}
	if err := ctx.Err(); err != nil {
		b.model = nil
		return err
	}
	if err := b.conn.Apply(tx); err != nil {
		b.model = nil // unknown now: re-read and reconcile next time
		return fmt.Errorf("apply nftables transaction: %w", err)
	}
	b.lastOps = tx.Len()
	b.owned, b.skel, b.lastNodePortIPs = newOwned, newSkel, npIPs
	if full {
		b.lastFull = b.now()
	}
	b.log.Debug("nftables sync", "full", full, "operations", tx.Len(), "changed", len(s.Changed))
	return nil
}

// Cleanup deletes kp's tables, and nothing else in the ruleset.
func (b *Backend) Cleanup(ctx context.Context) error {
	tx := &Transaction{}
	for _, f := range families {
		st, err := b.conn.Read(f)
		if err != nil {
			return fmt.Errorf("cleanup: %w", err)
		}
		if st != nil {
			tx.delTable(f)
		}
	}
	if err := b.conn.Apply(tx); err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	if tx.Len() > 0 {
		b.log.Info("removed kp's nftables tables", "tables", tx.Len())
	}
	b.model = nil
	return nil
}

// Counters returns the per-endpoint new-connection counters, by endpoint
// chain name, of both families.
func (b *Backend) Counters() (map[string]Counter, error) {
	out := map[string]Counter{}
	for _, f := range families {
		cs, err := b.conn.Counters(f)
		if err != nil {
			return nil, err
		}
		for k, v := range cs {
			out[k] = v
		}
	}
	return out, nil
}
