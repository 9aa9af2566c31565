package conntrack

import (
	"context"
	"errors"
	"fmt"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
	"github.com/ti-mo/netfilter"
	"golang.org/x/sys/unix"
)

// Conn is the seam between kp and the kernel's conntrack table: a netlink
// socket in production, a fake in unit tests.
type Conn interface {
	// Dump lists every entry, both IP families.
	Dump() ([]Flow, error)
	// Delete removes one entry; an entry already gone is not an error.
	Delete(f Flow) error
	Close() error
}

// Dialer opens Conns in one network namespace.
type Dialer struct {
	// NetNS is an open file descriptor of the namespace (/run/netns/NAME);
	// 0 means the calling process's own.
	NetNS int
}

// Open returns a netlink connection to conntrack in d's namespace.
func (d Dialer) Open() (Conn, error) {
	c, err := ct.Dial(&netlink.Config{NetNS: d.NetNS})
	if err != nil {
		return nil, fmt.Errorf("conntrack: open netlink socket: %w", err)
	}
	return &netlinkConn{c: c}, nil
}

type netlinkConn struct{ c *ct.Conn }

func (n *netlinkConn) Dump() ([]Flow, error) {
	ks, err := n.c.Dump(nil)
	if err != nil {
		return nil, fmt.Errorf("conntrack: dump: %w", err)
	}
	out := make([]Flow, 0, len(ks))
	for _, k := range ks {
		out = append(out, fromKernel(k))
	}
	return out, nil
}

func (n *netlinkConn) Delete(f Flow) error {
	if err := n.c.Delete(toKernel(f)); err != nil {
		// Expired, or deleted by someone else, since the dump.
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("conntrack: delete %s %s -> %s: %w", f.ProtocolName(), f.Orig.Src, f.Orig.Dst, err)
	}
	return nil
}

func (n *netlinkConn) Close() error { return n.c.Close() }

// EventType says what happened to a flow.
type EventType string

const (
	EventNew     EventType = "new"
	EventUpdate  EventType = "update"
	EventDestroy EventType = "destroy"
)

// Event is one change of the conntrack table.
type Event struct {
	Type EventType
	Flow Flow
}

// eventBuffer is the socket's receive buffer: events come in bursts (a
// client opening many connections), and an overrun loses them.
const eventBuffer = 4 << 20

// Watch streams conntrack events from d's namespace to events until ctx is
// done, then returns nil. It returns an error when the stream breaks; an
// overrun socket (ENOBUFS) means events were lost, so a caller that keeps a
// table of flows should dump again before watching anew. It does not close
// events.
func (d Dialer) Watch(ctx context.Context, events chan<- Event) error {
	c, err := ct.Dial(&netlink.Config{NetNS: d.NetNS})
	if err != nil {
		return fmt.Errorf("conntrack: open netlink socket: %w", err)
	}
	_ = c.SetReadBuffer(eventBuffer)
	raw := make(chan ct.Event, 256)
	errc, err := c.Listen(raw, 1, netfilter.GroupsCT)
	if err != nil {
		c.Close()
		return fmt.Errorf("conntrack: listen for events: %w", err)
	}
	// Close makes the worker return; drain raw meanwhile so it never
	// blocks on a send nobody reads.
	defer func() {
		done := make(chan struct{})
		go func() {
			for {
				select {
				case <-raw:
				case <-errc:
				case <-done:
					return
				}
			}
		}()
		c.Close()
		close(done)
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			return fmt.Errorf("conntrack: event stream: %w", err)
		case e := <-raw:
			ev, ok := eventOf(e)
			if !ok {
				continue
			}
			select {
			case events <- ev:
			case <-ctx.Done():
				return nil
			}
		}
	}
}

func eventOf(e ct.Event) (Event, bool) {
	if e.Flow == nil {
		return Event{}, false
	}
	var t EventType
	switch e.Type {
	case ct.EventNew:
		t = EventNew
	case ct.EventUpdate:
		t = EventUpdate
	case ct.EventDestroy:
		t = EventDestroy
	default:
		return Event{}, false
	}
	return Event{Type: t, Flow: fromKernel(*e.Flow)}, true
}
