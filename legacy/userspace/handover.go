package userspace

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kpproxy/kp/conntrack"
)

// A switch away from the userspace mode hands each UDP flow to the new
// mode without losing a datagram. A flow's conntrack entry redirects it to
// a listener for as long as the entry lives, so a flow that keeps sending
// stays on the old proxy until its entry goes; and the entry must not go
// while a request of the flow is with the endpoint, or the answer leaves
// from the listener's address untranslated and the client drops it (KF-1
// in docs/known-flakes.md: the conntrack cleaner did just that). So once
// the rules are gone (Cleanup):
//   - the conntrack cleaner spares the entries that redirect to a listener
//     (Redirects);
//   - the proxy deletes a flow's entry itself when the flow is idle: right
//     after the answer that leaves it no request outstanding, after
//     handoverQuiet without a datagram either way, or at Shutdown;
//   - a datagram of a handed-over flow that was redirected before its
//     entry went, so reached the listener after, is sent on through the new
//     mode from the client's own address (reinject): the endpoint the new
//     mode picks answers the client, as it answers the client's next
//     datagrams.
//
// TCP needs none of this: a connection keeps its own entry and ends on the
// proxy.

// handoverQuiet hands over a flow whose requests were not all answered
// (an endpoint that answers some datagrams with none) once it carried
// nothing either way for this long.
const handoverQuiet = time.Second

// handover holds the redirect entries of the UDP flows a drain hands over.
type handover struct {
	mu sync.Mutex
	// flows are the entries still to hand over, by client and listener
	// port; done are those handed over, kept to reinject late datagrams.
	flows map[flowKey]conntrack.Flow
	done  map[flowKey]conntrack.Flow
}

// flowKey is one client's flow to one listener.
type flowKey struct {
	client netip.AddrPort
	port   uint16
}

// keyOf is the key of a redirect entry: its client, and the listener it
// redirects to.
func keyOf(f conntrack.Flow) flowKey { return flowKey{f.Orig.Src, f.Reply.Src.Port()} }

// Redirects reports whether conntrack entry f redirects a UDP flow to one
// of this proxy's listeners that a drain has not handed over yet: the
// conntrack cleaner leaves it to the proxy (conntrack.Spared).
func (b *Backend) Redirects(f conntrack.Flow) bool {
	if f.Protocol != conntrack.ProtoUDP || !f.DNATed() {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.down {
		return false
	}
	for _, p := range b.proxies {
		if p.protocol() == "UDP" && p.port() == int(f.Reply.Src.Port()) {
			return true
		}
	}
	return false
}

// startHandover indexes the entries that redirect to the UDP listeners
// (Cleanup removed the rules, so no new one comes), and hands over at once
// those of flows with no session: nothing of theirs is with an endpoint.
func (b *Backend) startHandover() error {
	if b.handover.Load() != nil {
		return nil // started already (Cleanup, then the switch's drain)
	}
	ports := map[uint16]bool{}
	b.mu.Lock()
	for _, p := range b.proxies {
		if p.protocol() == "UDP" {
			ports[uint16(p.port())] = true
		}
	}
	b.mu.Unlock()
	if len(ports) == 0 {
		return nil
	}
	c, err := b.ops.conntrack()
	if err != nil {
		return err
	}
	defer c.Close()
	flows, err := c.Dump()
	if err != nil {
		return err
	}
	h := &handover{flows: map[flowKey]conntrack.Flow{}, done: map[flowKey]conntrack.Flow{}}
	for _, f := range flows {
		if f.Protocol == conntrack.ProtoUDP && f.DNATed() && ports[f.Reply.Src.Port()] && f.Reply.Dst == f.Orig.Src {
			h.flows[keyOf(f)] = f
		}
	}
	b.handover.Store(h)
	for k := range h.flows {
		if !b.hasSession(k) {
			b.handOver(k)
		}
	}
	go b.handOverQuiet(h)
	return nil
}

// hasSession reports whether the UDP listener on k.port has a session for
// k.client.
func (b *Backend) hasSession(k flowKey) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, p := range b.proxies {
		if u, ok := p.(*udpProxy); ok && u.port() == int(k.port) {
			u.mu.Lock()
			s := u.sessions[k.client]
			u.mu.Unlock()
			return s != nil
		}
	}
	return false
}

// handOver deletes k's redirect entry: the flow's next datagram takes the
// new mode's path. It reports whether k was still to hand over.
func (b *Backend) handOver(k flowKey) bool {
	h := b.handover.Load()
	if h == nil {
		return false
	}
	h.mu.Lock()
	f, ok := h.flows[k]
	if ok {
		delete(h.flows, k)
		h.done[k] = f
	}
	h.mu.Unlock()
	if !ok {
		return false
	}
	c, err := b.ops.conntrack()
	if err == nil {
		err = c.Delete(f)
		c.Close()
	}
	if err != nil {
		b.log.Warn("userspace drain: hand-over of a UDP flow failed; the conntrack cleaner deletes its entry", "client", k.client, "destination", f.Orig.Dst, "err", err)
		return true
	}
	b.stats.handover.WithLabelValues("handed_over").Inc()
	return true
}

// handedOver returns the entry of k when the drain handed k over.
func (b *Backend) handedOver(k flowKey) (conntrack.Flow, bool) {
	h := b.handover.Load()
	if h == nil {
		return conntrack.Flow{}, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	f, ok := h.done[k]
	return f, ok
}

// handOverQuiet hands over the flows quiet for handoverQuiet, until the
// drain has handed over every flow or Shutdown ran.
func (b *Backend) handOverQuiet(h *handover) {
	t := time.NewTicker(handoverQuiet / 4)
	defer t.Stop()
	for range t.C {
		var quiet []flowKey
		b.mu.Lock()
		down := b.down
		for _, p := range b.proxies {
			if u, ok := p.(*udpProxy); ok {
				quiet = append(quiet, u.quiet(handoverQuiet)...)
			}
		}
		b.mu.Unlock()
		for _, k := range quiet {
			b.handOver(k)
		}
		h.mu.Lock()
		left := len(h.flows)
		h.mu.Unlock()
		if left == 0 || down {
			return
		}
	}
}

// handOverAll hands over every flow left (Shutdown, before the listeners
// close).
func (b *Backend) handOverAll() {
	h := b.handover.Load()
	if h == nil {
		return
	}
	h.mu.Lock()
	keys := make([]flowKey, 0, len(h.flows))
	for k := range h.flows {
		keys = append(keys, k)
	}
	h.mu.Unlock()
	for _, k := range keys {
		b.handOver(k)
	}
}

// quiet lists the flows of p's sessions that carried nothing for d.
func (p *udpProxy) quiet(d time.Duration) []flowKey {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []flowKey
	for c, s := range p.sessions {
		if time.Since(time.Unix(0, s.last.Load())) >= d {
			out = append(out, flowKey{c, uint16(p.port())})
		}
	}
	return out
}

// reinject sends a datagram of flow f, which reached the listener after
// its entry was handed over, on through the new mode: from the client's
// address to the address the client sent to (a transparent socket, which
// CAP_NET_ADMIN allows), so conntrack gives it the entry and the endpoint
// the client's next datagrams get.
func (b *Backend) reinject(f conntrack.Flow, payload []byte) error {
	network := "udp4"
	if f.Orig.Src.Addr().Is6() {
		network = "udp6"
	}
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			level, opt := unix.SOL_IP, unix.IP_TRANSPARENT
			if network == "udp6" {
				level, opt = unix.SOL_IPV6, unix.IPV6_TRANSPARENT
			}
			serr = errors.Join(unix.SetsockoptInt(int(fd), level, opt, 1),
				unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1))
		})
		return errors.Join(err, serr)
	}}
	var c net.PacketConn
	err := b.ops.inNS(func() (err error) {
		c, err = lc.ListenPacket(context.Background(), network, f.Orig.Src.String())
		return err
	})
	if err != nil {
		return fmt.Errorf("bind the client's address %s: %w", f.Orig.Src, err)
	}
	defer c.Close()
	_, err = c.WriteTo(payload, net.UDPAddrFromAddrPort(f.Orig.Dst))
	return err
}
