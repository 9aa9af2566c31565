// Package nft is kp's default backend: it renders a proxy.State into one
// nftables table per IP family (ip kp, ip6 kp) and applies only the
// difference against what it knows is in the kernel, atomically, in one
// netlink batch per sync.
package nft

import (
	"context"
	"fmt"
	"github.com/google/nftables/expr"
	"log/slog"
	"net/netip"
	"runtime/debug"
	"slices"
	"sync"
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

	// tables is what kp knows of each of its tables; nil means unknown
	// (start, or after a failed transaction): the next sync reads the
	// kernel and reconciles everything.
	tables   map[family]*tableBook
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
}

// tableBook is kp's bookkeeping of one table: what is in the kernel, and
// which service port wrote what.
type tableBook struct {
	model  *tableState
	owned  map[proxy.ServicePortName]*footprint // what each service port wrote last
	owners *elementOwners
	skel   *view
}

// own records fp as what name wrote; an empty footprint (a port of the
// other family, for instance) is not kept.
func (book *tableBook) own(name proxy.ServicePortName, fp *footprint) {
	if fp == nil || len(fp.chains)+len(fp.sets)+len(fp.elems)+len(fp.slots) == 0 {
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
// a table that does not exist yet goes in a few: see applyStage). After a successful
// sync only s.Changed is rendered; a full reconcile happens at start, after
// a failure, when the Node changed, and every fullSyncInterval, when the
// kernel is read again so that whatever changed behind kp's back (another
// tool, an operator's nft command) is repaired.
func (b *Backend) Sync(ctx context.Context, s *proxy.State) error {
	if b.tables != nil && b.now().Sub(b.lastFull) > fullSyncInterval {
		b.tables = nil
	}
	full := b.tables == nil || s.NodeChanged
	if b.tables == nil {
		b.tables = map[family]*tableBook{}
	}
	npIPs, err := b.nodePortIPs(s)
	if err != nil {
		b.log.Warn("cannot list node addresses for NodePorts; keeping the previous ones", "err", err)
		npIPs = b.lastNodePortIPs
	}
	tx := &Transaction{}
	if full {
		// A full sync makes garbage many times what it keeps; with the
		// runtime's default the heap would grow to twice everything kp
		// holds before a collection. Collect sooner, for this sync only.
		defer debug.SetGCPercent(debug.SetGCPercent(fullSyncGCPercent))
	}
	if st, ok := b.conn.(streamer); ok && full {
		if tx, err = st.Stream(); err != nil {
			b.tables = nil
			return fmt.Errorf("start the nftables transaction: %w", err)
		}
	}
	defer tx.discard()
	var stagedFams []family // their base chains go in the last transaction
	for _, f := range families {
		book := b.tables[f]
		staged := false
		if book == nil {
			model, err := b.conn.Read(f)
			if err != nil {
				b.tables = nil
				return fmt.Errorf("read %s %s: %w", f.name, TableName, err)
			}
			if model == nil {
				tx.addTable(f)
				model = newTableState()
				staged = b.stagedFrom > 0 && len(s.Services) >= b.stagedFrom
			}
			book = &tableBook{model: model}
			b.tables[f] = book
			full = true
		}
		skel := b.skeleton(f, proxy.FilterAddrs(f.pf, npIPs), proxy.FilterPrefixes(f.pf, b.cfg.ClusterCIDRs),
			proxy.FilterPrefixes(f.pf, s.ServiceCIDRs))
		b.slotsMu.Lock()
		if full {
			err = b.syncFull(ctx, tx, f, book, s, skel, staged)
		} else {
			b.syncChanged(tx, f, book, s, skel)
		}
		b.slotsMu.Unlock()
		if err != nil {
			b.tables = nil
			return err
		}
		book.skel = skel
		if staged {
			stagedFams = append(stagedFams, f)
		}
	}
	for _, f := range stagedFams {
		book := b.tables[f]
		diff(tx, f, book.model, book.skel, book.skel) // the base chains
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
	if err := b.conn.Apply(tx); err != nil {
		b.tables = nil // unknown now: re-read and reconcile next time
		return fmt.Errorf("apply nftables transaction: %w", err)
	}
	b.lastOps, b.lastFullSync, b.lastNodePortIPs = tx.Len(), full, npIPs
	if full {
		b.lastFull = b.now()
		// A full sync's garbage is the size of the whole ruleset, many
		// times what kp keeps: give it back now rather than keep it
		// until the runtime's scavenger gets to it, without holding up
		// the end of the sync (a forced GC takes a while at 10,000s of
		// Services).
		go debug.FreeOSMemory()
	}
	b.log.Debug("nftables sync", "full", full, "operations", tx.Len(), "changed", len(s.Changed))
	return nil
}

// fullSyncGCPercent is GOGC during a full sync (see Sync).
const fullSyncGCPercent = 25

// fullSyncGroup is how many Services a full sync renders before it encodes
// them: the memory of that many rendered Services, against fewer, larger
// element messages.
const fullSyncGroup = 256

// A full sync into a table that does not exist yet (a node kp never ran
// on, or one just rebooted) goes in fullSyncStages transactions instead of
// one, when it has at least fullSyncStagedFrom Services: nothing of kp's is
// in the kernel to keep whole, each stage holds whole Services (their
// chains and every element naming them), and only a stage's batch is held,
// not the whole table's (17 MB at 10,000 × 10, the largest single part of
// kp's peak). The price is the kernel's: each transaction adding rules that
// jump validates the whole table so far (20–60 ms at 10,000), hence few
// stages. Packets still see one transaction: the table's base chains, the
// only objects hooked into the kernel's path, go in with the last stage, so
// until then the table is inert (a kube-proxy still serving the node keeps
// serving it) and then it is whole. A sync over an existing table stays one
// transaction. A failed stage fails the sync and leaves an inert table; the
// next one reads the kernel and reconciles in one transaction.
const (
	fullSyncStages     = 4
	fullSyncStagedFrom = 4 * fullSyncStages * fullSyncGroup
)

// stageSize is how many Services of n go in a stage: a whole number of
// groups.
func stageSize(n int) int {
	groups := (n + fullSyncGroup - 1) / fullSyncGroup
	return max(1, (groups+fullSyncStages-1)/fullSyncStages) * fullSyncGroup
}

// applyStage applies what tx holds and starts it again, empty.
func (b *Backend) applyStage(tx *Transaction) error {
	if err := b.conn.Apply(tx); err != nil {
		return fmt.Errorf("apply a stage of a full sync into a new table: %w", err)
	}
	next := &Transaction{}
	if st, ok := b.conn.(streamer); ok {
		var err error
		if next, err = st.Stream(); err != nil {
			return fmt.Errorf("start the nftables transaction: %w", err)
		}
	}
	*tx = *next
	return nil
}

// streamer is a Conn that can encode a transaction while it is built
// (netlinkConn; the Fake keeps every operation, for tests to read).
type streamer interface {
	Stream() (*Transaction, error)
}

// syncFull renders every service port and removes whatever else the table
// holds. It goes Service by Service, in name order: each group of
// fullSyncGroup is rendered, diffed against the model and handed to the
// transaction's stream before the next, so that a full sync never holds
// the whole rendered ruleset
// (at 10,000 Services it was most of kp's peak memory). The skeleton goes
// first, as service objects name its chains and sets; what nobody wants
// any more is deleted last.
func (b *Backend) syncFull(ctx context.Context, tx *Transaction, f family, book *tableBook, s *proxy.State, skel *view, staged bool) error {
	book.owned = make(map[proxy.ServicePortName]*footprint, len(s.Services))
	book.owners = newElementOwners()
	slots := b.slots[f]
	slots.seen = map[string]bool{}
	first := skel
	if staged {
		first = withoutBaseChains(skel) // they come last (see fullSyncStages)
	}
	diff(tx, f, book.model, first, first)
	if err := tx.spill(); err != nil {
		return err
	}
	// In name order, so that slots allocated afresh (after a restart) are
	// the same for the same Services, and so that the first owner of a
	// shared element (see elementOwners) is the first to render it.
	names := make([]proxy.ServicePortName, 0, len(s.Services))
	for name := range s.Services {
		names = append(names, name)
	}
	slices.SortFunc(names, compareNames)
	stage := len(names) + 1 // no stage ends before the last group
	if staged {
		stage = stageSize(len(names))
	}
	// Services are diffed and spilled a group at a time: one message per
	// group for each set's elements, not one per Service.
	want := newView()
	for i, name := range names {
		v := b.render(f, slots, s.Services[name], s.Endpoints[name], s.Node)
		fp := footprintOf(name, v)
		book.own(name, fp)
		book.owners.add(fp)
		want.mergeObjects(v)
		for set, es := range v.elements {
			for k, e := range es {
				if unshared(set) || book.owners.owner(refTo(set, k)) == fp {
					want.putElement(set, k, e)
				}
			}
		}
		if (i+1)%fullSyncGroup != 0 && i != len(names)-1 {
			continue
		}
		diff(tx, f, book.model, want, want)
		if err := tx.spill(); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		want = newView()
		if (i+1)%stage == 0 && i != len(names)-1 {
			if err := b.applyStage(tx); err != nil {
				return err
			}
		}
	}
	slots.releaseUnseen(nil)
	diff(tx, f, book.model, newView(), goneFromModel(book.model, skel, book.owned, book.owners))
	return tx.spill()
}

// withoutBaseChains is v less its base chains (a shallow copy).
func withoutBaseChains(v *view) *view {
	out := &view{chains: map[string]*Chain{}, sets: v.sets, elements: v.elements, counters: v.counters}
	for name, c := range v.chains {
		if c.Hook == nil {
			out.chains[name] = c
		}
	}
	return out
}

// syncChanged renders the changed service ports only, and the skeleton.
func (b *Backend) syncChanged(tx *Transaction, f family, book *tableBook, s *proxy.State, skel *view) {
	touched := newView() // old and new objects of the changed ports
	rendered := map[proxy.ServicePortName]*view{}
	slots := b.slots[f]
	slots.seen = map[string]bool{}
	for name := range s.Changed {
		old := book.owned[name]
		v := newView()
		var fp *footprint
		if sp := s.Services[name]; sp != nil {
			v = b.render(f, slots, sp, s.Endpoints[name], s.Node)
			fp = footprintOf(name, v)
		}
		book.own(name, fp)
		if old != nil {
			book.owners.remove(old)
			touched.merge(old.scope())
		}
		if fp != nil {
			book.owners.add(fp)
		}
		rendered[name] = v
		touched.merge(v)
	}
	slots.releaseUnseen(touched.chains)
	want := newView()
	want.merge(skel)
	for _, v := range rendered {
		want.mergeObjects(v)
		// A changed port's endpoint slots are its own; a slot of an
		// unchanged port cannot have been a changed port's (blocks
		// change hands only through a sync of the port that gets it).
		for set, es := range v.elements {
			if unshared(set) {
				for k, e := range es {
					want.putElement(set, k, e)
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
				want.putElement(set, k, e)
			}
		}
	}
	scope := newView()
	scope.merge(book.skel)
	scope.merge(touched)
	scope.merge(want)
	diff(tx, f, book.model, want, scope)
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
