package userspace

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/kpproxy/kp/proxy"
)

// dialTimeout bounds one dial to an endpoint; past it the next endpoint is
// tried. Short, because the client is waiting for the whole chain.
const dialTimeout = 2 * time.Second

// tcpProxy accepts one service port's redirected TCP connections and
// proxies each to an endpoint.
type tcpProxy struct {
	name  proxy.ServicePortName
	ln    *net.TCPListener
	bal   *familyBalancers
	b     *Backend
	log   *slog.Logger
	close chan struct{}
	// open counts the connections this listener holds (accepted, not yet
	// closed), against the cap --userspace-max-connections.
	open atomic.Int64
}

func (p *tcpProxy) port() int { return p.ln.Addr().(*net.TCPAddr).Port }

func (p *tcpProxy) stop() {
	close(p.close)
	p.ln.Close()
}

// serve accepts until the listener is closed.
func (p *tcpProxy) serve() {
	for {
		c, err := p.ln.AcceptTCP()
		if err != nil {
			select {
			case <-p.close:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// EMFILE and friends: say so, back off, keep serving.
			p.b.fdError(p.name, err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if err := p.b.ops.redirected(c); errors.Is(err, errNotRedirected) {
			// Straight to the listener's port, not through a Service:
			// the rules' filter would have refused it, but it is absent
			// while an old proxy drains and before a new listener's port
			// is written. A reset, as the filter's.
			p.b.stats.direct.WithLabelValues("TCP").Inc()
			p.log.Debug("connection kp did not redirect; refused", "servicePort", p.name.String(), "client", c.RemoteAddr(), "to", c.LocalAddr())
			c.SetLinger(0)
			c.Close()
			continue
		} else if err != nil {
			p.log.Debug("no original destination; let through", "servicePort", p.name.String(), "client", c.RemoteAddr(), "err", err)
		}
		if max := int64(p.b.cfg.UserspaceMaxConnections); max > 0 && p.open.Load() >= max {
			// Over the cap: a reset at once, so the client fails fast
			// (and retries elsewhere) instead of waiting on a backlog.
			p.b.stats.refused.WithLabelValues("TCP").Inc()
			p.log.Debug("connection cap reached; refused", "servicePort", p.name.String(), "max", max)
			c.SetLinger(0)
			c.Close()
			continue
		}
		if !p.b.fdRoom(2) {
			// The endpoint's socket would eat into kp's own reserve
			// (the accepted one is held already): refused as at the cap.
			p.b.fdRefused(p.name, "TCP")
			c.SetLinger(0)
			c.Close()
			continue
		}
		if !p.b.conns.add(c) { // shutting down
			c.Close()
			continue
		}
		p.open.Add(1)
		go func() {
			defer p.open.Add(-1)
			p.handle(c)
		}()
	}
}

// handle dials an endpoint for client (the next one when a dial fails)
// and copies both ways until both sides have closed.
func (p *tcpProxy) handle(client *net.TCPConn) {
	defer p.b.conns.done(client)
	local := client.LocalAddr().(*net.TCPAddr).AddrPort()
	remote := client.RemoteAddr().(*net.TCPAddr).AddrPort()
	bal := p.bal.forClient(local.Addr(), func() bool { return p.b.inCluster(remote.Addr()) })
	if bal.size() == 0 {
		// The Service has endpoints, but none for this traffic (a Local
		// policy without local endpoints): upstream drops it, so the
		// client waits and times out; kp holds the connection silently
		// for as long, then resets it.
		p.hold(client)
		return
	}
	back, ep, ok := p.dial(bal, remote.Addr())
	if !ok {
		// No endpoint answered (or the list is empty for this traffic, as
		// under externalTrafficPolicy Local without local endpoints): a
		// reset, so the client fails at once.
		client.SetLinger(0)
		client.Close()
		return
	}
	if !p.b.conns.add(back) {
		back.Close()
		client.Close()
		return
	}
	defer p.b.conns.done(back)
	st := p.b.stats.endpoint(ref(p.name, ep))
	st.newConns.Add(1)
	st.activeConns.Add(1)
	p.b.stats.conns.WithLabelValues("TCP").Inc()
	p.b.stats.active.WithLabelValues("TCP").Inc()
	defer func() {
		st.activeConns.Add(-1)
		p.b.stats.active.WithLabelValues("TCP").Dec()
	}()

	// io.Copy between two *net.TCPConn splices (the bytes stay in the
	// kernel); each direction half-closes the other side when its source
	// ends, so a client that shuts down writing still gets the answer.
	// With an idle timeout, a connection silent both ways that long is
	// closed (both sides, which ends both copies).
	idle := newIdleWatch(p.b.cfg.UserspaceTCPIdleTimeout)
	up := make(chan int64, 1)
	go func() {
		n, err := idle.copy(back, client)
		if errors.Is(err, errIdle) {
			p.idleClose(client, back)
		}
		back.CloseWrite()
		up <- n
	}()
	down, err := idle.copy(client, back)
	if errors.Is(err, errIdle) {
		p.idleClose(client, back)
	}
	client.CloseWrite()
	n := <-up
	client.Close()
	back.Close()
	st.bytes.Add(uint64(n + down))
	p.b.stats.bytes.WithLabelValues("TCP", "to_endpoint").Add(float64(n))
	p.b.stats.bytes.WithLabelValues("TCP", "to_client").Add(float64(down))
}

// idleClose ends a connection that was idle past the timeout.
func (p *tcpProxy) idleClose(client, back *net.TCPConn) {
	p.b.stats.idleClosed.WithLabelValues("TCP").Inc()
	p.log.Debug("idle connection closed", "servicePort", p.name.String(), "client", client.RemoteAddr())
	client.Close()
	back.Close()
}

// dropHold is how long a connection that has no endpoint to go to is held
// without an answer, as a dropped SYN would leave the client waiting.
const dropHold = 30 * time.Second

// hold keeps c silent until the client gives up, dropHold passes or the
// proxy shuts down, then resets it.
func (p *tcpProxy) hold(c *net.TCPConn) {
	c.SetReadDeadline(time.Now().Add(dropHold))
	io.Copy(io.Discard, c)
	c.SetLinger(0)
	c.Close()
}

// dial tries endpoints in balancer order until one accepts.
func (p *tcpProxy) dial(bal *balancer, client netip.Addr) (*net.TCPConn, netip.AddrPort, bool) {
	if bal == nil {
		return nil, netip.AddrPort{}, false
	}
	tried := map[netip.AddrPort]bool{}
	for range bal.size() {
		ep, ok := bal.pick(client, tried)
		if !ok {
			break
		}
		tried[ep] = true
		ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
		c, err := p.b.ops.dial(ctx, "tcp", ep.String())
		cancel()
		if err == nil {
			return c.(*net.TCPConn), ep, true
		}
		p.b.stats.dialErrors.WithLabelValues("TCP").Inc()
		if isFDExhausted(err) {
			p.b.fdError(p.name, err)
			break // no other endpoint can be dialed either
		}
		p.log.Debug("dial endpoint failed; trying the next", "servicePort", p.name.String(), "endpoint", ep, "err", err)
	}
	return nil, netip.AddrPort{}, false
}
