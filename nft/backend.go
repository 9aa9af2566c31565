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
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/nftables/expr"

	"github.com/kpproxy/kp/internal/gctune"
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

	// tables is what kp knows of each of its tables; nil means unknown
	// (start, or after a failed transaction): the next sync reads the
	// kernel and reconciles everything.
	tables   map[family]*tableBookkeeping
	lastFull time.Time

	lastNodePortIPs []netip.Addr

	// slots is each family's allocation of endpoint slots. It outlives
	// tables: after a failure or the periodic re-read, keeping the same
	// slots keeps the endpoints map's elements, and so their counters.
	slots   map[family]*slotTable
	slotsMu sync.Mutex // the status API reads slots while a sync renders

	// lastOps is the size of the last applied batch, for tests.
	lastOps int
	// stagedFrom is how many Services a full sync into a table that does
	// not exist yet must have to go in fullSyncStages transactions
	// (stageFullSync); 0 never stages.
	stagedFrom int
	// lastFullSync reports whether the last Sync re-rendered everything.
	lastFullSync bool
	// drifted: another process changed kp's tables (DetectDrift); the
	// next Sync reads them again.
	drifted atomic.Bool
}

// tableBookkeeping is kp's bookkeeping of one table: the record of what is in
// the kernel, and which service port wrote what.
type tableBookkeeping struct {
	record *tableRecord
	owned  map[proxy.ServicePortName]*footprint // what each service port wrote last
	owners *elementOwners
	// hairpins holds the hairpin set's pods (nil until the first full sync
	// over a table just read: the record holds the kernel's elements then).
	hairpins *hairpins
	// skel is the skeleton of the last sync, skelKey what it was built
	// from: a partial sync over the same skeleton leaves it out of its
	// diff (it is the kernel's already: a change of the kernel's table
	// makes the next sync a full one).
	skel    *objects
	skelKey string
}

// own records fp as what name wrote; an empty footprint (a port of the
// other family, for instance) is not kept.
func (book *tableBookkeeping) own(name proxy.ServicePortName, fp *footprint) {
	if fp == nil || len(fp.chains)+len(fp.sets)+len(fp.blocks)+len(fp.elems)+len(fp.slots)+len(fp.pods) == 0 {
		delete(book.owned, name)
		return
	}
	book.owned[name] = fp
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
	masqMark, err := cfg.MasqueradeMark()
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	return &Backend{
		cfg: cfg, log: log, conn: conn,
		masqMark:     masqMark,
		now:          time.Now,
		slots:        map[family]*slotTable{familyIPv4: newSlotTable(), familyIPv6: newSlotTable()},
		stagedFrom:   fullSyncStagedFrom,
		localAddrs:   func() ([]netip.Addr, error) { return listLocalAddrsIn(0) },
		defaultAddrs: func() ([]netip.Addr, error) { return defaultRouteAddrsIn(0) },
	}, nil
}

func (b *Backend) Mode() proxy.Mode { return proxy.ModeNFTables }

// LastTransactionOps is the number of operations in the last applied batch.
func (b *Backend) LastTransactionOps() int { return b.lastOps }

// LastSyncFull reports whether the last Sync re-rendered every service port
// (proxy.FullSyncReporter).
func (b *Backend) LastSyncFull() bool { return b.lastFullSync }

// Sync makes kp's tables match s in one transaction (a large full sync into
// a table that does not exist yet goes in a few: see stager). After a successful
// sync only s.Changed is rendered; a full reconcile happens at start, after
// a failure, when the Node changed, when another process changed kp's
// tables (DetectDrift), and every fullSyncInterval: the kernel is read
// again so that whatever changed behind kp's back (another tool, an
// operator's nft command) is repaired.
func (b *Backend) Sync(ctx context.Context, s *proxy.State) error {
	if b.drifted.Swap(false) || b.tables != nil && b.now().Sub(b.lastFull) > fullSyncInterval {
		b.tables = nil
	}
	full := b.tables == nil || s.NodeChanged
	if b.tables == nil {
		b.tables = map[family]*tableBookkeeping{}
	}
	npIPs, err := b.nodePortIPs(s)
	if err != nil {
		b.log.Warn("cannot list node addresses for NodePorts; keeping the previous ones", "err", err)
		npIPs = b.lastNodePortIPs
	}
	tx := &Transaction{}
	if full {
		defer gctune.Lower(gctune.FullSync)() // for this sync only
	}
	if st, ok := b.conn.(streamer); ok && full {
		if tx, err = st.Stream(); err != nil {
			b.tables = nil
			return fmt.Errorf("start the nftables transaction: %w", err)
		}
	}
	defer tx.discard()
	st := &stager{conn: b.conn}
	defer func() { _ = st.wait() }() // a stage still in flight when the sync fails
	var stagedFams []family          // their base chains go in the last transaction
	for _, f := range families {
		book := b.tables[f]
		staged := false
		if book == nil {
			record, err := b.conn.Read(f)
			if err != nil {
				b.tables = nil
				return fmt.Errorf("read %s %s: %w", f.name, TableName, err)
			}
			if record == nil {
				tx.addTable(f)
				record = newTableRecord()
				staged = b.stagedFrom > 0 && len(s.Services) >= b.stagedFrom
			}
			book = &tableBookkeeping{record: record}
			b.tables[f] = book
			full = true
		}
		npF, localF, svcF := proxy.FilterAddrs(f.pf, npIPs), proxy.FilterPrefixes(f.pf, b.cfg.LocalCIDRs()), proxy.FilterPrefixes(f.pf, s.ServiceCIDRs)
		skelKey := fmt.Sprint(npF, localF, svcF)
		skel, sameSkel := book.skel, book.skel != nil && book.skelKey == skelKey
		if !sameSkel {
			skel = b.skeleton(f, npF, localF, svcF)
		}
		b.slotsMu.Lock()
		if full {
			err = b.syncFull(ctx, tx, st, f, book, s, skel, staged)
		} else {
			b.syncChanged(tx, f, book, s, skel, sameSkel)
		}
		b.slotsMu.Unlock()
		if err != nil {
			b.tables = nil
			return err
		}
		book.skel, book.skelKey = skel, skelKey
		if staged {
			stagedFams = append(stagedFams, f)
		}
	}
	for _, f := range stagedFams {
		book := b.tables[f]
		diff(tx, f, book.record, book.skel, book.skel) // the base chains
		if err := tx.spill(); err != nil {
			b.tables = nil
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		b.tables = nil
		return err
	}
	if !full {
		b.carryCounters(tx)
	}
	if err := st.wait(); err != nil {
		b.tables = nil
		return err
	}
	if err := b.conn.Apply(tx); err != nil {
		b.tables = nil // unknown now: re-read and reconcile next time
		return fmt.Errorf("apply nftables transaction: %w", err)
	}
	b.lastOps, b.lastFullSync, b.lastNodePortIPs = tx.Len(), full, npIPs
	if full {
		b.lastFull = b.now() // the sync loop then gives its garbage back
	}
	b.log.Debug("nftables sync", "full", full, "operations", tx.Len(), "changed", len(s.Changed))
	return nil
}

// syncChanged renders the changed service ports only, and the skeleton
// unless it is the one of the sync before (sameSkel).
func (b *Backend) syncChanged(tx *Transaction, f family, book *tableBookkeeping, s *proxy.State, skel *objects, sameSkel bool) {
	touched := newObjects() // old and new objects of the changed ports
	rendered := map[proxy.ServicePortName]*objects{}
	var olds, news []*footprint
	slots := b.slots[f]
	slots.seen = map[string]bool{}
	for name := range s.Changed {
		old := book.owned[name]
		if old != nil {
			recallSlots(book.record, slots, old)
		}
		v := newObjects()
		var fp *footprint
		if sp := s.Services[name]; sp != nil {
			v = b.render(f, slots, sp, s.Endpoints[name], s.Node)
			fp = footprintOf(name, v)
		}
		book.own(name, fp)
		if old != nil {
			book.owners.remove(old)
			touched.merge(old.scope())
			olds = append(olds, old)
		}
		if fp != nil {
			book.owners.add(fp)
			news = append(news, fp)
		}
		rendered[name] = v
		touched.merge(v)
	}
	slots.releaseUnseen(touched.blocks, false)
	desired := newObjects()
	if !sameSkel {
		desired.merge(skel)
	}
	for _, v := range rendered {
		desired.mergeWithoutElements(v)
		// A changed port's endpoint slots are its own; a slot of an
		// unchanged port cannot have been a changed port's (blocks
		// change hands only through a sync of the port that gets it).
		for set, es := range v.elements {
			if unshared(set) {
				for k, e := range es {
					desired.putElement(set, k, e)
				}
			}
		}
	}
	// Every other key a changed port had or has goes to its first
	// owner's element: a changed port's, or that of an unchanged port
	// that shared it, rendered again (its rendering has not changed: that
	// is rare, and kp keeps no element values between syncs).
	for set, es := range touched.elements {
		if unshared(set) {
			continue
		}
		for k := range es {
			o := book.owners.owner(refTo(set, k))
			if o == nil {
				continue
			}
			v := rendered[o.name]
			if v == nil {
				sp := s.Services[o.name]
				if sp == nil {
					continue // cannot be: an owner has a footprint, so a Service port
				}
				v = b.render(f, slots, sp, s.Endpoints[o.name], s.Node)
				rendered[o.name] = v
			}
			if e, ok := v.elements[set][k]; ok {
				desired.putElement(set, k, e)
			}
		}
	}
	scope := newObjects()
	if !sameSkel {
		scope.merge(book.skel)
	}
	scope.merge(touched)
	scope.merge(desired)
	book.syncHairpins(olds, news, desired, scope)
	diff(tx, f, book.record, desired, scope)
	book.record.forgetDerived()
}

// syncHairpins moves the pods of the changed ports' footprints from olds
// to news, and puts in desired and scope the hairpin elements of the pods
// that either lists, in the record as they are before: a pod's element is
// added when its count leaves 0, deleted when it returns to 0, and
// untouched otherwise (a pod moving from one Service to another in one
// sync keeps its element).
func (book *tableBookkeeping) syncHairpins(olds, news []*footprint, desired, scope *objects) {
	h := book.hairpins
	var pods []netip.Addr
	for _, fp := range slices.Concat(olds, news) {
		pods = slices.AppendSeq(pods, fp.pods.all(h.f))
	}
	recallHairpins(book.record, h, slices.Values(pods))
	for _, fp := range olds {
		h.remove(fp.pods)
	}
	for _, fp := range news {
		h.add(fp.pods)
	}
	for _, a := range pods {
		e := hairpinElement(a)
		scope.addElement(setHairpin, e)
		if h.has(a) {
			desired.addElement(setHairpin, e)
		}
	}
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
	b.tables = nil
	return nil
}

// carryCounters starts the DNAT rules of the chains tx rewrites with the counts
// the old rules had for the same endpoint, so that an endpoint's count of
// new connections survives a change to its Service's other endpoints. (A
// full sync after kp restarts starts them from zero.) Connections made
// between the read and the commit are not counted.
func (b *Backend) carryCounters(tx *Transaction) {
	// Only chains that get DNAT rules back (those of Services with
	// session affinity) have counts to carry: the others count in the
	// endpoints map's elements.
	flushed := map[family][]string{}
	seen := map[family]map[string]bool{}
	for _, o := range tx.ops {
		if o.kind != opAddRule || seen[o.fam][o.chain.Name] {
			continue
		}
		if _, _, ok := dnatCounter(o.rule.Exprs); !ok {
			continue
		}
		if seen[o.fam] == nil {
			seen[o.fam] = map[string]bool{}
		}
		seen[o.fam][o.chain.Name] = true
		flushed[o.fam] = append(flushed[o.fam], o.chain.Name)
	}
	for f, names := range flushed {
		old, err := b.conn.DNATCounters(f, names)
		if err != nil {
			b.log.Warn("cannot read the counters of the chains this sync rewrites; they restart from zero", "err", err)
			continue
		}
		for i := range tx.ops {
			o := &tx.ops[i]
			if o.kind != opAddRule || o.fam != f || old[o.chain.Name] == nil {
				continue
			}
			target, _, ok := dnatCounter(o.rule.Exprs)
			if !ok {
				continue
			}
			c, ok := old[o.chain.Name][target]
			if !ok {
				continue
			}
			// The first rule to the endpoint takes its whole count (with
			// session affinity two rules DNAT to it).
			delete(old[o.chain.Name], target)
			for _, e := range o.rule.Exprs {
				if ce, ok := e.(*expr.Counter); ok {
					ce.Packets, ce.Bytes = c.Packets, c.Bytes
				}
			}
		}
	}
}

// NodePortScope implements proxy.NodePortScoper: --nodeport-addresses as
// this mode was given it.
func (b *Backend) NodePortScope() ([]netip.Prefix, bool) {
	return b.cfg.NodePortAddresses, b.cfg.NodePortPrimary
}
