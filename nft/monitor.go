package nft

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/kpproxy/kp/internal/nftgen"
	"github.com/kpproxy/kp/internal/nlsock"
	"github.com/kpproxy/kp/proxy"
)

// The kernel's change events for kp's tables: nf_tables tells every socket
// in the NFNLGRP_NFTABLES group of each object a transaction adds or
// deletes (table, chain, rule, set, element, named object), each message
// stamped with the netlink port id of the socket that sent the
// transaction, then of the transaction itself in a NEWGEN message that
// names the committing process (its pid and name). Changes to kp's tables
// sent from a socket that is not kp's are drift.

// monitorBuffer is the monitor socket's receive buffer. The kernel tells
// of kp's own transactions too: a change of a few Services is a few
// kilobytes, but a full sync of thousands of Services overflows any buffer
// (ENOBUFS). The monitor then judges by the generations it heard nothing of
// (see ownGens). A variable for the tests.
var monitorBuffer = 16 << 20

// ownPorts are the port ids of kp's batch sockets (the last few: one is
// replaced after a failed transaction).
type ownPorts struct {
	mu  sync.Mutex
	ids []uint32
}

func (o *ownPorts) add(id uint32) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ids = append(o.ids, id)
	if len(o.ids) > 16 {
		o.ids = o.ids[1:]
	}
}

func (o *ownPorts) has(id uint32) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Contains(o.ids, id)
}

// portID is the netlink port id the kernel gave conn.
func portID(conn *netlink.Conn) (uint32, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return 0, err
	}
	var sa unix.Sockaddr
	var serr error
	if err := raw.Control(func(fd uintptr) { sa, serr = unix.Getsockname(int(fd)) }); err != nil {
		return 0, err
	}
	if serr != nil {
		return 0, serr
	}
	nl, ok := sa.(*unix.SockaddrNetlink)
	if !ok {
		return 0, fmt.Errorf("netlink socket bound to %T", sa)
	}
	return nl.Pid, nil
}

// watcher is implemented by a Conn that hears of changes other processes
// make to kp's tables (the netlink Conn; the Fake does not).
type watcher interface {
	watch(ctx context.Context, drifted func(proxy.Drift)) error
}

var _ watcher = (*netlinkConn)(nil)

// watch listens to the kernel's nftables notifications until ctx ends and
// reports each transaction that changed kp's tables from a socket not
// kp's, and each overflow of its socket (Unsure).
func (c *netlinkConn) watch(ctx context.Context, drifted func(proxy.Drift)) error {
	mon, err := c.subscribe()
	if err != nil {
		return err
	}
	return c.listen(ctx, mon, drifted)
}

// subscribe opens a socket in the NFNLGRP_NFTABLES group of kp's
// namespace.
func (c *netlinkConn) subscribe() (*netlink.Conn, error) {
	cfg := &netlink.Config{}
	if c.nsFd > 0 {
		cfg.NetNS = c.nsFd
	}
	mon, err := netlink.Dial(unix.NETLINK_NETFILTER, cfg)
	if err != nil {
		return nil, fmt.Errorf("open netlink: %w", err)
	}
	if err := nlsock.Buffers(0, 0, monitorBuffer)(mon); err != nil {
		_ = mon.Close()
		return nil, err
	}
	if err := mon.JoinGroup(unix.NFNLGRP_NFTABLES); err != nil {
		_ = mon.Close()
		return nil, fmt.Errorf("listen to nftables notifications: %w", err)
	}
	// Every transaction after this generation is notified to mon.
	c.subscribedGen.Store(c.gens.current(c.nsFd))
	return mon, nil
}

// listen reads mon's notifications until ctx ends, then closes it.
func (c *netlinkConn) listen(ctx context.Context, mon *netlink.Conn, drifted func(proxy.Drift)) error {
	stop := context.AfterFunc(ctx, func() { _ = mon.Close() })
	defer func() {
		if stop() {
			_ = mon.Close()
		}
	}()
	tx := &foreignTx{own: c.own.has}
	// heard is the generation of the last transaction heard of whole:
	// anything an overflow loses comes after it.
	heard := c.subscribedGen.Load()
	for {
		msgs, err := mon.Receive()
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, unix.ENOBUFS):
			tx.reset()
			if cur := c.overflowedAt(); lostAreOwn(heard, cur, c.gens.has) {
				heard = cur // only kp's own transactions went unheard
				continue
			}
			drifted(proxy.Drift{Unsure: true, What: "the kernel's nftables notifications overflowed kp's socket " +
				"(a large transaction, kp's own or another's): some were lost"})
			continue
		case err != nil:
			return fmt.Errorf("receive nftables notifications: %w", err)
		}
		for _, m := range msgs {
			if nftgen.IsNewGen(m) {
				if g, err := nftgen.Parse(m.Data); err == nil && g.ID > heard {
					heard = g.ID
				}
			}
			if d := tx.note(m); d != nil {
				drifted(*d)
			}
		}
	}
}

// overflowedAt is the generation an overflow's judgement goes up to, read
// once kp's transactions in flight have booked theirs (a second at most).
func (c *netlinkConn) overflowedAt() uint32 {
	for deadline := time.Now().Add(time.Second); c.gens.inFlight.Load() > 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	return c.gens.current(c.nsFd)
}

// foreignTx gathers the changes to kp's tables of the transaction being
// notified, when another process sent it.
type foreignTx struct {
	own     func(port uint32) bool
	changes map[change]int
	tables  map[string]bool
}

// change is one kind of change a transaction made: "deleted" "element"
// "of set service-ips".
type change struct{ verb, kind, of string }

func (tx *foreignTx) reset() { tx.changes, tx.tables = nil, nil }

// note takes one notification; at a transaction's NEWGEN it returns the
// drift, if the transaction changed kp's tables.
func (tx *foreignTx) note(m netlink.Message) *proxy.Drift {
	if m.Header.Type>>8 != unix.NFNL_SUBSYS_NFTABLES || tx.own(m.Header.PID) {
		return nil
	}
	if nftgen.IsNewGen(m) {
		defer tx.reset()
		if len(tx.changes) == 0 {
			return nil
		}
		d := &proxy.Drift{What: tx.describe()}
		if g, err := nftgen.Parse(m.Data); err == nil && g.Comm != "" {
			d.By = fmt.Sprintf("%s (pid %d)", g.Comm, g.PID)
		}
		return d
	}
	// Port 0 is the kernel itself (a table whose owner went away), not
	// another process.
	if m.Header.PID == 0 {
		return nil
	}
	table, c, ok := notification(m)
	if !ok {
		return nil
	}
	if tx.changes == nil {
		tx.changes, tx.tables = map[change]int{}, map[string]bool{}
	}
	tx.changes[c]++
	tx.tables[table] = true
	return nil
}

// describe says what the transaction changed, at most a few kinds of
// change: "ip kp: deleted 1 element of set service-ips".
func (tx *foreignTx) describe() string {
	var parts []string
	for c, n := range tx.changes {
		kind := c.kind
		if n != 1 {
			kind += "s"
		}
		parts = append(parts, strings.TrimSpace(fmt.Sprintf("%s %d %s %s", c.verb, n, kind, c.of)))
	}
	slices.Sort(parts)
	if len(parts) > 4 {
		parts = append(parts[:4], fmt.Sprintf("and %d more kinds of change", len(parts)-4))
	}
	tables := make([]string, 0, len(tx.tables))
	for t := range tx.tables {
		tables = append(tables, t)
	}
	slices.Sort(tables)
	return strings.Join(tables, ", ") + ": " + strings.Join(parts, "; ")
}

// notification reads one change notification: kp's table it changed
// ("ip kp") and the change; ok is false for another table's, or a message
// that is no change.
func notification(m netlink.Message) (table string, c change, ok bool) {
	t := m.Header.Type & 0xff
	var nameAttr uint16
	var of string
	switch t {
	case unix.NFT_MSG_NEWTABLE, unix.NFT_MSG_DELTABLE:
		c.kind = "table"
	case unix.NFT_MSG_NEWCHAIN, unix.NFT_MSG_DELCHAIN:
		c.kind, nameAttr = "chain", unix.NFTA_CHAIN_NAME
	case unix.NFT_MSG_NEWRULE, unix.NFT_MSG_DELRULE:
		c.kind, nameAttr, of = "rule", unix.NFTA_RULE_CHAIN, "of chain "
	case unix.NFT_MSG_NEWSET, unix.NFT_MSG_DELSET:
		c.kind, nameAttr = "set", unix.NFTA_SET_NAME
	case unix.NFT_MSG_NEWSETELEM, unix.NFT_MSG_DELSETELEM:
		c.kind, nameAttr, of = "element", unix.NFTA_SET_ELEM_LIST_SET, "of set "
	case unix.NFT_MSG_NEWOBJ, unix.NFT_MSG_DELOBJ:
		c.kind, nameAttr = "object", unix.NFTA_OBJ_NAME
	default:
		return "", c, false
	}
	c.verb = "deleted"
	if slices.Contains([]netlink.HeaderType{unix.NFT_MSG_NEWTABLE, unix.NFT_MSG_NEWCHAIN, unix.NFT_MSG_NEWRULE,
		unix.NFT_MSG_NEWSET, unix.NFT_MSG_NEWSETELEM, unix.NFT_MSG_NEWOBJ}, t) {
		c.verb = "added"
	}
	if len(m.Data) < 4 {
		return "", c, false
	}
	var fam family
	switch nftables.TableFamily(m.Data[0]) {
	case familyIPv4.nf:
		fam = familyIPv4
	case familyIPv6.nf:
		fam = familyIPv6
	default:
		return "", c, false
	}
	ad, err := netlink.NewAttributeDecoder(m.Data[4:])
	if err != nil {
		return "", c, false
	}
	var tableName, name string
	for ad.Next() {
		switch {
		case ad.Type() == 1: // every kind's table attribute (NFTA_TABLE_NAME, NFTA_CHAIN_TABLE, ...) is 1
			tableName = ad.String()
		case nameAttr != 0 && ad.Type() == nameAttr:
			name = ad.String()
		}
	}
	if tableName != TableName || ad.Err() != nil {
		return "", c, false
	}
	c.of = of + name
	return fam.name + " " + TableName, c, true
}
