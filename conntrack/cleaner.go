package conntrack

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kpproxy/kp/proxy"
)

// Why an entry is stale; the reason label of the deletion metric.
const (
	// ReasonEndpointGone: DNATed to an address that no longer serves the
	// Service port (the pod was replaced, or the Service scaled to zero).
	ReasonEndpointGone = "endpoint_gone"
	// ReasonNotNATed: the flow started while the Service address had no
	// rule, so it was never DNATed; conntrack keeps sending it nowhere
	// (upstream issue #48370) for as long as the client keeps sending. For
	// TCP, a connection attempt's entry (SYN_SENT, see Judge).
	ReasonNotNATed = "not_nated"
	// ReasonServiceRemoved: the Service port is gone altogether.
	ReasonServiceRemoved = "service_removed"
)

// keepTargets returns the endpoints a UDP or SCTP flow of a Service port may
// keep going to; an entry pointing anywhere else is stale. As upstream, that
// is every serving endpoint: a flow already going to a pod that is
// terminating but still serving may finish there, even though new flows go
// to ready pods (and topology or a traffic policy may send new flows
// elsewhere without the old ones being wrong).
func keepTargets(eps []proxy.Endpoint) []proxy.Endpoint {
	var out []proxy.Endpoint
	for _, e := range eps {
		if e.Serving {
			out = append(out, e)
		}
	}
	return out
}

// cleaned reports whether stale entries of protocol p are deleted. TCP is
// left alone: its own state machine ends a connection whose endpoint is gone
// (a reset, or a timeout), and deleting an entry mid-connection would break
// a graceful termination. UDP has no end, so a client that keeps sending
// keeps a stale entry alive forever. SCTP associations are treated like UDP:
// a deleted entry makes the next packet pick a live endpoint, which aborts
// the stale association at once instead of letting it blackhole.
func cleaned(p uint8) bool { return p == ProtoUDP || p == ProtoSCTP }

// Staleness is the decision for one flow: Stale with the Reason, and the
// Service port it was addressed to.
type Staleness struct {
	Stale       bool
	Reason      string
	ServicePort proxy.ServicePortName
}

// Judge decides which conntrack entries are stale after a sync from prev to
// cur. Build one per sync.
type Judge struct {
	ix *Index
	// removed indexes the service ports of prev that cur no longer has, on
	// addresses cur does not reuse.
	removed *Index
	cur     *proxy.State
	// keep: per service port of cur, the reply sources its entries may
	// keep (keepTargets), built when a flow to it is judged first.
	keep map[proxy.ServicePortName]map[netip.AddrPort]bool
}

// keepOf is name's keep set (keepTargets of cur's endpoints), built once.
func (j *Judge) keepOf(name proxy.ServicePortName) map[netip.AddrPort]bool {
	if m, ok := j.keep[name]; ok {
		return m
	}
	m := map[netip.AddrPort]bool{}
	if j.cur != nil && j.cur.Services[name] != nil {
		for _, e := range keepTargets(j.cur.Endpoints[name]) {
			m[e.AddrPort()] = true
		}
	}
	j.keep[name] = m
	return m
}

// mayBeStale reports whether Judge can find f stale: a UDP or SCTP entry,
// or a TCP connection attempt never DNATed (judgeTCP).
func mayBeStale(f Flow) bool {
	if f.Protocol == ProtoTCP {
		return f.ProtoState == tcpSynSent && !f.DNATed()
	}
	return cleaned(f.Protocol)
}

// NewJudge prepares the decisions for State cur (prev, the previously
// synced State, may be nil). nodeIPs are the namespace's local addresses.
func NewJudge(prev, cur *proxy.State, nodeIPs []netip.Addr) *Judge {
	j := &Judge{ix: NewIndex(cur, nodeIPs), cur: cur, keep: map[proxy.ServicePortName]map[netip.AddrPort]bool{}}
	if prev != nil {
		gone := &proxy.State{Services: map[proxy.ServicePortName]*proxy.ServicePort{}, Node: prev.Node}
		for name, sp := range prev.Services {
			if cur == nil || cur.Services[name] == nil {
				gone.Services[name] = sp
			}
		}
		j.removed = NewIndex(gone, nodeIPs)
	}
	return j
}

// Judge decides about one flow.
func (j *Judge) Judge(f Flow) Staleness {
	if f.Protocol == ProtoTCP {
		return j.judgeTCP(f)
	}
	if !cleaned(f.Protocol) {
		return Staleness{}
	}
	if t, ok := j.ix.lookup(f); ok {
		if j.keepOf(t.name)[f.Reply.Src] {
			return Staleness{ServicePort: t.name}
		}
		reason := ReasonEndpointGone
		if !f.DNATed() {
			reason = ReasonNotNATed
		}
		return Staleness{Stale: true, Reason: reason, ServicePort: t.name}
	}
	if j.removed != nil {
		if t, ok := j.removed.lookup(f); ok {
			return Staleness{Stale: true, Reason: ReasonServiceRemoved, ServicePort: t.name}
		}
	}
	return Staleness{}
}

// judgeTCP finds the one kind of stale TCP entry: a connection attempt to a
// Service address that was never DNATed (SYN_SENT, the reply tuple still
// the Service address), made while the address had no rule (before the
// Service was synced, or before any proxy ran). Its SYNs went nowhere and
// the client gave up, but the entry stays for two minutes, renewed by each
// SYN, and a new connection from the same source port (ports are reused)
// matches it: conntrack sees a retransmission, NAT has already decided
// (nothing, or too late: a confirmed entry is never NATed), so the SYN
// goes past DNAT to the Service address, where the reject rule refuses it.
// Deleting the entry lets that SYN start a new one, which is DNATed. Any
// other TCP entry is left to TCP (see cleaned); an attempt's entry has no
// connection to break.
func (j *Judge) judgeTCP(f Flow) Staleness {
	if f.ProtoState != tcpSynSent || f.DNATed() {
		return Staleness{}
	}
	if t, ok := j.ix.lookup(f); ok {
		return Staleness{Stale: true, Reason: ReasonNotNATed, ServicePort: t.name}
	}
	return Staleness{}
}

// Cleaner deletes stale UDP and SCTP conntrack entries after every sync, and
// the TCP connection attempts that never met a rule (see judgeTCP). It
// is a reconciler: each run judges a full dump of the table against the
// State just synced, so an entry a run missed (or that appeared in a race
// with the sync) is deleted by the next one.
type Cleaner struct {
	dial       func() (Conn, error)
	localAddrs func() ([]netip.Addr, error)
	log        *slog.Logger
	accounting bool
	// keepRedirected: see CleanerConfig.KeepRedirected; it follows the
	// mode when kp switches modes (SetKeepRedirected).
	keepRedirected atomic.Bool
	// spared: see Spare.
	spared atomic.Pointer[spared]

	deleted *prometheus.CounterVec
	errors  prometheus.Counter
	setup   sync.Once
	// counted: how many UDP and SCTP service ports a State has, kept
	// from sync to sync (cleanedPorts).
	counted cleanedCount
	// last is the State of the last run, lastOK whether that run left
	// nothing stale behind (nothingNew).
	last   *proxy.State
	lastOK bool
	// switched is set when the mode changed (Spare, SetKeepRedirected):
	// the next run judges the table whatever changed, since what the old
	// mode did with a flow is no change of a Service.
	switched atomic.Bool
}

// CleanerConfig configures a Cleaner. The zero value works in the
// process's own network namespace.
type CleanerConfig struct {
	Log *slog.Logger
	// Dial opens the conntrack connection for one run; nil means the
	// process's own namespace.
	Dial func() (Conn, error)
	// LocalAddrs lists the namespace's addresses (NodePorts answer there);
	// nil means the process's own.
	LocalAddrs func() ([]netip.Addr, error)
	// EnableAccounting turns on per-flow counters and timestamps in the
	// namespace at the first run (see EnableAccounting).
	EnableAccounting bool
	// KeepRedirected keeps the NATed entries of service ports that still
	// have endpoints: in the userspace mode the kernel only redirects to
	// kp's own listeners, which choose endpoints themselves, so such an
	// entry is not stale (its reply source is the node, not an endpoint)
	// and deleting it would cut a live UDP flow. The entries of service
	// ports left without endpoints (their packets must meet the reject
	// rule), of removed ones, and those the kernel confirmed to a Service
	// address without NAT (before kp's first rule for it) are deleted.
	KeepRedirected bool
}

// Spared is a party that deletes some entries itself: a userspace mode
// that drains after a switch hands each UDP flow redirected to it over to
// the new mode when the flow is idle (legacy/userspace/handover.go).
type Spared interface {
	// Redirects reports whether f is one of those entries.
	Redirects(f Flow) bool
}

type spared struct{ Spared }

// Spare makes the cleaner leave the entries s deletes itself; nil spares
// none.
func (c *Cleaner) Spare(s Spared) {
	c.switched.Store(true)
	if s == nil {
		c.spared.Store(nil)
		return
	}
	c.spared.Store(&spared{s})
}

// SetKeepRedirected changes CleanerConfig.KeepRedirected, for a proxy
// that switched to or from the userspace mode.
func (c *Cleaner) SetKeepRedirected(keep bool) {
	c.keepRedirected.Store(keep)
	c.switched.Store(true)
}

// NewCleaner returns a Cleaner; register its Collectors with the metrics.
func NewCleaner(cfg CleanerConfig) *Cleaner {
	c := &Cleaner{dial: cfg.Dial, localAddrs: cfg.LocalAddrs, log: cfg.Log, accounting: cfg.EnableAccounting}
	c.keepRedirected.Store(cfg.KeepRedirected)
	if c.dial == nil {
		c.dial = Dialer{}.Open
	}
	if c.localAddrs == nil {
		c.localAddrs = proxy.LocalAddrs
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	c.deleted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kp_conntrack_entries_deleted_total",
		Help: "Stale conntrack entries deleted after syncs, by protocol and reason",
	}, []string{"protocol", "reason"})
	c.errors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kp_conntrack_cleanup_errors_total",
		Help: "Conntrack cleanups that failed (the next sync tries again)",
	})
	return c
}

// Collectors are the Cleaner's metrics.
func (c *Cleaner) Collectors() []prometheus.Collector {
	return []prometheus.Collector{c.deleted, c.errors}
}

// Start turns flow accounting on before the first sync, when the kernel's
// conntrack is loaded already: a flow the first sync lets through then
// has its counters and start time (an entry gets them only when created
// with accounting on, and the first sync's observers run after kp is
// ready, while the first connections are made).
func (c *Cleaner) Start() {
	if c.accounting && AccountingLoaded() {
		EnableAccounting(c.log)
	}
}

// Synced implements proxy.SyncObserver.
func (c *Cleaner) Synced(ctx context.Context, prev, cur *proxy.State) {
	c.setup.Do(func() {
		// By the first sync the backend's NAT rules have loaded conntrack,
		// so its sysctls exist: for a kernel that had no conntrack when
		// kp started (Start turned accounting on otherwise).
		if c.accounting {
			EnableAccounting(c.log)
		}
	})
	n, err := c.Clean(ctx, prev, cur)
	if err != nil && ctx.Err() != nil {
		// kp is shutting down (or the sync was abandoned): not a failure.
		c.log.Info("conntrack cleanup stopped", "generation", cur.Generation, "deleted", n, "why", context.Cause(ctx))
		return
	}
	if err != nil {
		c.errors.Inc()
		c.log.Error("conntrack cleanup failed; the next sync retries", "generation", cur.Generation, "deleted", n, "err", err)
	}
}

// Clean deletes the entries that are stale after a sync from prev to cur,
// and returns how many it deleted.
func (c *Cleaner) Clean(ctx context.Context, prev, cur *proxy.State) (int, error) {
	prevN, curN := c.counted.ports(prev, cur)
	switched := c.switched.Swap(false)
	skip := prevN == 0 && curN == 0 && !servesNewTCP(prev, cur) || !switched && c.nothingNew(prev, cur)
	c.last, c.lastOK = cur, skip
	if skip {
		return 0, nil // nothing can have become stale: skip the dump
	}
	n, err := c.clean(ctx, prev, cur)
	c.lastOK = err == nil
	return n, err
}

// nothingNew reports whether the sync from prev to cur can have made no
// entry stale, without looking at the table: the cleaner's last run was on
// prev and succeeded (so nothing stale was left), cur follows prev with the
// Node unchanged, no Service address is new to TCP, and none of the ports
// cur changed is UDP or SCTP, before or after. An entry stale now would
// then have been stale at the last run, which deleted it; an entry made
// since went where prev's rules sent it, still a live destination. On a
// node whose table always holds UDP (DNS), this keeps a sync that changed
// only TCP Services from dumping the table and indexing every Service.
func (c *Cleaner) nothingNew(prev, cur *proxy.State) bool {
	if prev == nil || cur == nil || c.last != prev || !c.lastOK || cur.Generation != prev.Generation+1 || cur.NodeChanged {
		return false
	}
	if servesNewTCP(prev, cur) {
		return false
	}
	for name := range cur.Changed {
		if isCleaned(prev.Services[name]) == 1 || isCleaned(cur.Services[name]) == 1 {
			return false
		}
	}
	return true
}

// clean dumps the table and deletes what the judge finds stale.
func (c *Cleaner) clean(ctx context.Context, prev, cur *proxy.State) (int, error) {
	conn, err := c.dial()
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	flows, err := conn.Dump()
	if err != nil {
		return 0, err
	}
	// Only these can be stale (Judge): the judge, which indexes every
	// Service of cur and prev, is built when one of them is there, not on
	// every sync of a node whose table holds only established TCP.
	var cands []Flow
	for _, f := range flows {
		if mayBeStale(f) {
			cands = append(cands, f)
		}
	}
	if len(cands) == 0 {
		return 0, nil
	}
	addrs, err := c.localAddrs()
	if err != nil {
		return 0, fmt.Errorf("list local addresses: %w", err)
	}
	j := NewJudge(prev, cur, addrs)
	deleted := 0
	var firstErr error
	for _, f := range cands {
		if ctx.Err() != nil {
			return deleted, ctx.Err()
		}
		s := j.Judge(f)
		if !s.Stale {
			continue
		}
		if c.keepRedirected.Load() && f.DNATed() && len(j.keepOf(s.ServicePort)) > 0 {
			continue
		}
		if sp := c.spared.Load(); sp != nil && sp.Redirects(f) {
			continue
		}
		if err := conn.Delete(f); err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		deleted++
		c.deleted.WithLabelValues(f.ProtocolName(), s.Reason).Inc()
		c.log.Info("deleted stale conntrack entry", "servicePort", s.ServicePort.String(), "reason", s.Reason,
			"protocol", f.ProtocolName(), "client", f.Orig.Src.String(), "destination", f.Orig.Dst.String(),
			"target", f.Reply.Src.String())
	}
	return deleted, firstErr
}

// servesNewTCP reports whether cur has a TCP Service address that prev did
// not (a Service port added or changed, the first sync, new node
// addresses for the NodePorts): only then can a connection attempt made
// before its rule be waiting in the table. Endpoints that come or go do
// not count: a Service port without endpoints rejects new connections
// before conntrack keeps them.
func servesNewTCP(prev, cur *proxy.State) bool {
	if cur == nil {
		return false
	}
	isTCP := func(sp *proxy.ServicePort) bool { return sp != nil && proxy.ProtocolNumber(sp.Protocol) == ProtoTCP }
	if prev == nil || cur.NodeChanged {
		for _, sp := range cur.Services {
			if isTCP(sp) {
				return true
			}
		}
		return false
	}
	for name := range cur.Changed {
		if sp := cur.Services[name]; isTCP(sp) && !prev.Services[name].Equal(sp) {
			return true
		}
	}
	return false
}
