package userspace

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kpproxy/kp/conntrack"
	"github.com/kpproxy/kp/proxy"
)

// udpIdleTimeout ends a UDP session that carried nothing either way for
// this long, unless --userspace-udp-idle-timeout says (upstream's
// userspace proxy had --udp-timeout, 250 ms; DNS needs far less than this).
const udpIdleTimeout = 30 * time.Second

// udpProxy receives one service port's redirected datagrams and forwards
// each client's (address and port) to one endpoint over a session socket;
// the endpoint's replies go back from the address the client sent to.
type udpProxy struct {
	name  proxy.ServicePortName
	socks []*net.UDPConn // udp4, and udp6 on the same port when IPv6 works
	bal   *familyBalancers
	b     *Backend
	log   *slog.Logger
	idle  time.Duration

	mu       sync.Mutex
	sessions map[netip.AddrPort]*udpSession
	closed   bool
}

// udpSession is one client's flow to one endpoint.
type udpSession struct {
	client netip.AddrPort
	local  netip.Addr // where the client's datagrams arrived (after redirect)
	sock   *net.UDPConn
	back   *net.UDPConn
	ep     netip.AddrPort
	st     *endpointStats
	last   atomic.Int64 // unix nanoseconds of the last datagram either way
	// pending counts the client's datagrams sent to the endpoint and not
	// answered yet (at least 0): a drain hands the flow over when an
	// answer leaves none (handover.go).
	pending atomic.Int64
}

func (p *udpProxy) port() int { return p.socks[0].LocalAddr().(*net.UDPAddr).Port }

// stop closes the listening sockets; open sessions run until idle.
func (p *udpProxy) stop() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	for _, s := range p.socks {
		s.Close()
	}
}

// serve reads one listening socket until it is closed.
func (p *udpProxy) serve(sock *net.UDPConn) {
	buf := make([]byte, 65535)
	oob := make([]byte, 128)
	for {
		n, oobn, _, from, err := sock.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			p.log.Debug("udp read", "servicePort", p.name.String(), "err", err)
			continue
		}
		local, ok := pktDst(oob[:oobn])
		if !ok {
			continue
		}
		if p.b.rulesRemoved.Load() {
			if f, ok := p.b.handedOver(flowKey{from, uint16(p.port())}); ok {
				p.late(f, buf[:n])
				continue
			}
		}
		s := p.session(sock, from, local)
		if s == nil {
			continue // no endpoint for this traffic: dropped
		}
		s.last.Store(time.Now().UnixNano())
		s.pending.Add(1)
		if _, err := s.back.Write(buf[:n]); err != nil {
			p.log.Debug("udp forward", "servicePort", p.name.String(), "endpoint", s.ep, "err", err)
			continue
		}
		s.st.bytes.Add(uint64(n))
		p.b.stats.bytes.WithLabelValues("UDP", "to_endpoint").Add(float64(n))
	}
}

// session returns client's session, opening one to the next endpoint when
// it has none.
func (p *udpProxy) session(sock *net.UDPConn, client netip.AddrPort, local netip.Addr) *udpSession {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := p.sessions[client]; s != nil {
		return s
	}
	if p.closed {
		return nil
	}
	if p.b.rulesRemoved.Load() {
		// The redirect rules, and the filter with them, are gone (a
		// switch away drains this proxy). A datagram carries no
		// conntrack lookup that would tell a redirected one from one sent
		// straight to the listener's port, so no client gets a new
		// session; the open ones are served on, as their conntrack
		// entries still redirect their flows here until the conntrack
		// cleaner moves them to the new mode. A flow whose session idled
		// out before its conntrack entry did is dropped until then.
		p.b.stats.direct.WithLabelValues("UDP").Inc()
		return nil
	}
	bal := p.bal.forClient(local, func() bool { return p.b.inCluster(client.Addr()) })
	ep, ok := bal.pick(client.Addr(), nil)
	if !ok {
		return nil
	}
	if !p.b.fdRoom(1) {
		p.b.fdRefused(p.name, "UDP") // the datagram is dropped
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	c, err := p.b.ops.dial(ctx, "udp", ep.String())
	cancel()
	if err != nil {
		p.b.stats.dialErrors.WithLabelValues("UDP").Inc()
		p.b.fdError(p.name, err)
		return nil
	}
	back := c.(*net.UDPConn)
	if !p.b.conns.add(back) {
		back.Close()
		return nil
	}
	s := &udpSession{client: client, local: local, sock: sock, back: back, ep: ep,
		st: p.b.stats.endpoint(ref(p.name, ep))}
	s.last.Store(time.Now().UnixNano())
	p.sessions[client] = s
	s.st.newConns.Add(1)
	s.st.activeConns.Add(1)
	p.b.stats.conns.WithLabelValues("UDP").Inc()
	p.b.stats.active.WithLabelValues("UDP").Inc()
	go p.replies(s)
	return s
}

// replies sends the endpoint's datagrams back to the client, from the
// address the client used, until the session is idle for p.idle.
func (p *udpProxy) replies(s *udpSession) {
	defer p.end(s)
	buf := make([]byte, 65535)
	oob := srcOOB(s.local)
	for {
		s.back.SetReadDeadline(time.Now().Add(p.idle))
		n, err := s.back.Read(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				if time.Since(time.Unix(0, s.last.Load())) < p.idle {
					continue // the client spoke meanwhile
				}
				p.b.stats.idleClosed.WithLabelValues("UDP").Inc()
				return
			}
			if errors.Is(err, unix.ECONNREFUSED) {
				continue // the endpoint's ICMP for an earlier datagram
			}
			return
		}
		s.last.Store(time.Now().UnixNano())
		if _, _, err := s.sock.WriteMsgUDPAddrPort(buf[:n], oob, s.client); err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			p.log.Debug("udp reply", "servicePort", p.name.String(), "client", s.client, "err", err)
			continue
		}
		s.st.bytes.Add(uint64(n))
		p.b.stats.bytes.WithLabelValues("UDP", "to_client").Add(float64(n))
		if s.pending.Add(-1) <= 0 {
			s.pending.Store(0)
			if p.b.rulesRemoved.Load() {
				p.b.handOver(flowKey{s.client, uint16(p.port())})
			}
		}
	}
}

// late sends on a datagram of flow f that reached the listener after the
// drain handed f over (handover.go).
func (p *udpProxy) late(f conntrack.Flow, payload []byte) {
	if err := p.b.reinject(f, payload); err != nil {
		p.b.stats.handover.WithLabelValues("reinject_failed").Inc()
		p.log.Warn("userspace drain: a datagram of a handed-over UDP flow is lost", "servicePort", p.name.String(),
			"client", f.Orig.Src, "destination", f.Orig.Dst, "err", err)
		return
	}
	p.b.stats.handover.WithLabelValues("reinjected").Inc()
}

// prune ends the sessions whose endpoint is not in valid: a UDP flow has no
// end the proxy could wait for, and a client that keeps sending (a
// resolver) must move to a current endpoint at once, as the other modes'
// conntrack cleanup makes it.
func (p *udpProxy) prune(valid map[netip.AddrPort]bool) {
	p.mu.Lock()
	var gone []*udpSession
	for c, s := range p.sessions {
		if !valid[s.ep] {
			gone = append(gone, s)
			delete(p.sessions, c)
		}
	}
	p.mu.Unlock()
	for _, s := range gone {
		s.back.Close() // replies ends, and with it the session
	}
}

func (p *udpProxy) end(s *udpSession) {
	p.mu.Lock()
	if p.sessions[s.client] == s {
		delete(p.sessions, s.client)
	}
	p.mu.Unlock()
	s.back.Close()
	p.b.conns.done(s.back)
	s.st.activeConns.Add(-1)
	p.b.stats.active.WithLabelValues("UDP").Dec()
}

// enablePktInfo asks the kernel for each datagram's destination address:
// after a redirect it is the node address the packet was redirected to,
// and replies must leave from it for conntrack to undo the redirect (a
// reply from another source would reach the client from the wrong
// address).
func enablePktInfo(c *net.UDPConn, v6 bool) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = raw.Control(func(fd uintptr) {
		if v6 {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_PKTINFO, 1)
		}
	})
	return errors.Join(err, serr)
}

// pktDst reads the destination address from a datagram's control messages.
func pktDst(oob []byte) (netip.Addr, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return netip.Addr{}, false
	}
	for _, m := range msgs {
		switch {
		case m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_PKTINFO && len(m.Data) >= unix.SizeofInet4Pktinfo:
			var a [4]byte
			copy(a[:], m.Data[8:12]) // struct in_pktinfo: ifindex, spec_dst, addr
			return netip.AddrFrom4(a), true
		case m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_PKTINFO && len(m.Data) >= unix.SizeofInet6Pktinfo:
			var a [16]byte
			copy(a[:], m.Data[:16]) // struct in6_pktinfo: addr, ifindex
			return netip.AddrFrom16(a), true
		}
	}
	return netip.Addr{}, false
}

// srcOOB is the control message that sends a datagram from local.
func srcOOB(local netip.Addr) []byte {
	if local.Is4() {
		return unix.PktInfo4(&unix.Inet4Pktinfo{Spec_dst: local.As4()})
	}
	return unix.PktInfo6(&unix.Inet6Pktinfo{Addr: local.As16()})
}
