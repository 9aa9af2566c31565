package nft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/kpproxy/kp/internal/nlsock"
)

// Conn is the seam between the backend and the kernel: the netlink
// connection in production, a Fake in unit tests.
type Conn interface {
	// Apply runs tx as one atomic kernel transaction: all or nothing.
	Apply(tx *Transaction) error
	// Read returns what kp's table of family f holds, or nil when the table
	// does not exist. Chain digests are unknown ("") after a Read.
	Read(f family) (*tableRecord, error)
	// DNATCounters returns, for those of chains that exist in kp's table
	// of family f, the counters of their rules that DNAT, summed by target.
	DNATCounters(f family, chains []string) (map[string]map[netip.AddrPort]Counter, error)
	// ElementCounters returns the per-element counters of the named map in
	// kp's table of family f, by key (keyID); nil when there is no such
	// map.
	ElementCounters(f family, set string) (map[string]Counter, error)
	// TimedElements returns the elements of the named set in kp's table of
	// family f with what is left of each one's life (affinity.go); nil
	// when there is no such set.
	TimedElements(f family, set string) ([]TimedElement, error)
}

// Counter is a named counter's value.
type Counter struct{ Packets, Bytes uint64 }

// netlinkConn talks to nf_tables in one network namespace: the process's
// own (nsFd 0) or the one nsFd refers to.
type netlinkConn struct {
	nsFd int

	mu     sync.Mutex
	batch  *netlink.Conn  // see batchSocket
	reader *nftables.Conn // see readSocket
	seq    uint32
	// own are the port ids of the batch sockets, whose transactions the
	// monitor knows for kp's own (monitor.go); gens the generations
	// they made.
	own  ownPorts
	gens ownGens
	// subscribedGen is the generation when the monitor subscribed.
	subscribedGen atomic.Uint32
}

// open is a connection for one read of the kernel's table (its buffers
// sized above the defaults, for large dumps).
func (c *netlinkConn) open() (*nftables.Conn, error) {
	opts := []nftables.ConnOption{nftables.WithSockOptions(batchBuffers(0, 0))}
	if c.nsFd > 0 {
		opts = append(opts, nftables.WithNetNSFd(c.nsFd))
	}
	return nftables.New(opts...)
}

// Per-operation allowances for batchBuffers: a generous bound on one
// message's bytes and on the kernel's accounting (truesize) of an error it
// sends back (kp asks for one acknowledgement per batch, but every failing
// message is answered).
const (
	sndBytesPerOp = 2048
	rcvBytesPerOp = 1024
)

// batchBuffers sizes the netlink socket for a batch of ops messages, as
// the nft CLI does for its batches (nlsock.Buffers: a send buffer of the
// default 212 kB holds about 4,000 operations, 100 Services of 10
// endpoints). With the batch's size known (bytes > 0), the send buffer is
// sized from it: the kernel doubles what it is given and refuses a message
// past the result.
func batchBuffers(ops, bytes int) nftables.SockOption {
	snd := ops * sndBytesPerOp
	if bytes > 0 {
		snd = bytes
	}
	return nlsock.Buffers(ops, snd, ops*rcvBytesPerOp)
}

func nfTable(f family) *nftables.Table { return &nftables.Table{Name: TableName, Family: f.nf} }

func (c *netlinkConn) Apply(tx *Transaction) error {
	var b *batch
	if enc, ok := tx.stream.(*batchEncoder); ok {
		if err := tx.spill(); err != nil {
			return err
		}
		tx.stream = nil
		if enc.empty() {
			enc.close()
			return nil
		}
		b = enc.finish()
	} else {
		if len(tx.ops) == 0 {
			return nil
		}
		var err error
		if b, err = encodeBatch(tx); err != nil {
			return err
		}
	}
	// A large transaction's generation is booked (see ownGens): the
	// counter before and after, one apart, means the transaction made the
	// second and no other came between. Only a large one can overflow
	// the monitor's socket; the two reads would be half of a small sync.
	book := b.len() >= bookGenFrom
	var before uint32
	if book {
		c.gens.inFlight.Add(1)
		defer c.gens.inFlight.Add(-1)
		before = c.gens.current(c.nsFd)
	}
	if err := c.sendBatch(b); err != nil {
		return fmt.Errorf("nftables transaction of %d operations: %w", len(b.notes), err)
	}
	if after := uint32(0); book && before != 0 {
		if after = c.gens.current(c.nsFd); after == before+1 {
			c.gens.add(after)
		}
	}
	return nil
}

// bookGenFrom is the number of messages from which a transaction's
// generation is booked.
const bookGenFrom = 256

// Stream returns a transaction that encodes its operations as they are
// spilled (Transaction.spill), for full syncs.
func (c *netlinkConn) Stream() (*Transaction, error) {
	enc, err := newBatchEncoder()
	if err != nil {
		return nil, err
	}
	return &Transaction{stream: enc}, nil
}

func queue(conn *nftables.Conn, o *op) error {
	t := nfTable(o.fam)
	switch o.kind {
	case opAddTable:
		conn.AddTable(t)
	case opDelTable:
		conn.DelTable(t)
	case opAddSet:
		if err := conn.AddSet(nfSet(t, o.set), nil); err != nil {
			return fmt.Errorf("add set %s: %w", o.set.Name, err)
		}
	case opDelSet:
		conn.DelSet(nfSet(t, o.set))
	case opDelCounter:
		conn.DeleteObject(&nftables.CounterObj{Table: t, Name: o.name})
	case opAddChain:
		conn.AddChain(nfChain(t, o.chain))
	case opFlushChain:
		conn.FlushChain(nfChain(t, o.chain))
	case opDelChain:
		conn.DelChain(nfChain(t, o.chain))
	case opAddRule:
		r := o.rule
		var ud []byte
		if r.Comment != "" {
			ud = userdata.AppendString(nil, userdata.TypeComment, r.Comment)
		}
		conn.AddRule(&nftables.Rule{Table: t, Chain: &nftables.Chain{Name: o.chain.Name, Table: t}, Exprs: r.Exprs, UserData: ud})
	default: // the elements: batchEncoder.addElements
		return fmt.Errorf("queue: operation %d is not encoded by google/nftables", o.kind)
	}
	return nil
}

// maxElementBytes bounds the estimated size of one element message's list.
// The elements of a message are one nested netlink attribute, whose length
// is 16 bits: past 64 KiB (about 600 service-ips elements with their
// comments) the length wraps and the kernel rejects the batch with a
// misleading error (ENOENT, ERANGE). Half of it leaves room for the
// estimate's slack.
const maxElementBytes = 32 << 10

func nfSet(t *nftables.Table, s *Set) *nftables.Set {
	ns := &nftables.Set{Table: t, Name: s.Name, KeyType: s.KeyType, Concatenation: s.Concat,
		Interval: s.Interval, Comment: s.Comment, Dynamic: s.Dynamic}
	if s.VMap {
		ns.IsMap, ns.DataType = true, nftables.TypeVerdict
	}
	if s.DataType.Bytes != 0 {
		ns.IsMap, ns.DataType = true, s.DataType
	}
	ns.Counter = s.Counter
	if s.KeyHostOrder {
		ns.KeyByteOrder = binaryutil.NativeEndian
	}
	if s.Timeout > 0 {
		ns.HasTimeout, ns.Timeout = true, s.Timeout
	}
	return ns
}

func nfChain(t *nftables.Table, c *Chain) *nftables.Chain {
	ch := &nftables.Chain{Name: c.Name, Table: t}
	if c.Hook != nil {
		prio := nftables.ChainPriority(c.Hook.Priority)
		ch.Type, ch.Hooknum, ch.Priority = c.Hook.Type, c.Hook.Hook, &prio
	}
	return ch
}

func (c *netlinkConn) Read(f family) (*tableRecord, error) {
	conn, err := c.open()
	if err != nil {
		return nil, fmt.Errorf("open netlink: %w", err)
	}
	tables, err := conn.ListTablesOfFamily(f.nf)
	if err != nil {
		return nil, fmt.Errorf("list %s tables: %w", f.name, err)
	}
	found := false
	for _, t := range tables {
		found = found || t.Name == TableName
	}
	if !found {
		return nil, nil
	}
	t := nfTable(f)
	st := newTableRecord()
	chains, err := conn.ListChainsOfTableFamily(f.nf)
	if err != nil {
		return nil, fmt.Errorf("list %s chains: %w", f.name, err)
	}
	for _, ch := range chains {
		if ch.Table.Name == TableName {
			st.chains[ch.Name] = 0
		}
	}
	sets, err := conn.GetSets(t)
	if err != nil {
		return nil, fmt.Errorf("list sets of %s %s: %w", f.name, TableName, err)
	}
	for _, s := range sets {
		if s.Anonymous {
			continue
		}
		st.sets[s.Name] = (&Set{Dynamic: s.Dynamic, Timeout: s.Timeout}).digest()
		if s.Dynamic {
			continue // filled by packets, not by kp
		}
		elems, err := conn.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("list elements of %s: %w", s.Name, err)
		}
		m := make(map[string]uint64, len(elems))
		for _, e := range elems {
			v := Element{}
			if e.VerdictData == nil && len(e.Val) > 0 {
				v.Data = e.Val
			}
			if d := e.VerdictData; d != nil {
				switch d.Kind {
				case expr.VerdictDrop:
					v.Verdict = verdictDrop
				case expr.VerdictGoto:
					v.Verdict, v.Chain = verdictGoto, d.Chain
				case expr.VerdictJump:
					v.Verdict, v.Chain = verdictJump, d.Chain
				}
			}
			m[keyID(e.Key, e.IntervalEnd)] = v.digest()
		}
		st.elements[s.Name] = m
	}
	objs, err := conn.GetObjects(t)
	if err != nil {
		return nil, fmt.Errorf("list objects of %s %s: %w", f.name, TableName, err)
	}
	for _, o := range objs {
		if co, ok := o.(*nftables.CounterObj); ok {
			st.counters[co.Name] = true
		}
	}
	return st, nil
}

func (c *netlinkConn) DNATCounters(f family, chains []string) (out map[string]map[netip.AddrPort]Counter, err error) {
	err = c.withReader(func(conn *nftables.Conn) error {
		t := nfTable(f)
		out = map[string]map[netip.AddrPort]Counter{}
		for _, name := range chains {
			rules, err := conn.GetRules(t, &nftables.Chain{Name: name, Table: t})
			if isNotFound(err) {
				continue // no such chain (or table) in this family
			}
			if err != nil {
				return fmt.Errorf("list rules of %s %s %s: %w", f.name, TableName, name, err)
			}
			for _, r := range rules {
				target, count, ok := dnatCounter(r.Exprs)
				if !ok {
					continue
				}
				m := out[name]
				if m == nil {
					m = map[netip.AddrPort]Counter{}
					out[name] = m
				}
				m[target] = Counter{Packets: m[target].Packets + count.Packets, Bytes: m[target].Bytes + count.Bytes}
			}
		}
		return nil
	})
	return out, err
}

func (c *netlinkConn) ElementCounters(f family, set string) (out map[string]Counter, err error) {
	err = c.withReader(func(conn *nftables.Conn) error {
		elems, err := conn.GetSetElements(&nftables.Set{Table: nfTable(f), Name: set})
		if isNotFound(err) {
			return nil // no such map (or table) in this family
		}
		if err != nil {
			return fmt.Errorf("list elements of %s %s %s: %w", f.name, TableName, set, err)
		}
		out = make(map[string]Counter, len(elems))
		for _, e := range elems {
			if e.Counter != nil {
				out[keyID(e.Key, e.IntervalEnd)] = Counter{Packets: e.Counter.Packets, Bytes: e.Counter.Bytes}
			}
		}
		return nil
	})
	return out, err
}

// withReader runs fn on the read socket, under the lock; a failure closes
// the socket, so the next read starts on a fresh one.
func (c *netlinkConn) withReader(fn func(conn *nftables.Conn) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	conn, err := c.readSocket()
	if err != nil {
		return err
	}
	if err := fn(conn); err != nil {
		_ = c.reader.CloseLasting()
		c.reader = nil
		return err
	}
	return nil
}

// isNotFound reports a missing chain, set or table. google/nftables
// formats the errno into its error (%v): errors.Is cannot always see it.
func isNotFound(err error) bool {
	return err != nil && (errors.Is(err, unix.ENOENT) || strings.Contains(err.Error(), "no such file or directory"))
}

// readSocket is the connection counters are read through; like the batch
// socket it stays open (see batchSocket).
func (c *netlinkConn) readSocket() (*nftables.Conn, error) {
	if c.reader != nil {
		return c.reader, nil
	}
	opts := []nftables.ConnOption{nftables.AsLasting()}
	if c.nsFd > 0 {
		opts = append(opts, nftables.WithNetNSFd(c.nsFd))
	}
	conn, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("open netlink: %w", err)
	}
	c.reader = conn
	return conn, nil
}

// dnatCounter reads a rule kp wrote with ruleBuilder.counter and dnat: its
// counter and the address and port it DNATs to.
func dnatCounter(es []expr.Any) (netip.AddrPort, Counter, bool) {
	var count *expr.Counter
	var addr netip.Addr
	var port uint16
	for _, e := range es {
		switch e := e.(type) {
		case *expr.Counter:
			count = e
		case *expr.Immediate:
			switch {
			case e.Register == 1:
				addr, _ = netip.AddrFromSlice(e.Data)
			case e.Register == 2 && len(e.Data) == 2:
				port = binary.BigEndian.Uint16(e.Data)
			}
		case *expr.NAT:
			if count != nil && addr.IsValid() && e.Type == expr.NATTypeDestNAT {
				return netip.AddrPortFrom(addr, port), Counter{Packets: count.Packets, Bytes: count.Bytes}, true
			}
		}
	}
	return netip.AddrPort{}, Counter{}, false
}

var errNoTable = errors.New("no such table")
