package userspace

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/kpproxy/kp/proxy"
)

// udpEcho answers every datagram on loopback with "re:" and the datagram.
func udpEcho(t *testing.T) netip.AddrPort {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			c.WriteToUDPAddrPort(append([]byte("re:"), buf[:n]...), from)
		}
	}()
	return c.LocalAddr().(*net.UDPAddr).AddrPort()
}

// TestUDPSessionsAnswerFromTheServiceAddressAndExpireWhenIdle runs the UDP
// proxy on loopback (no redirect): a session per client port, replies from
// the address the client sent to, and its end after the idle timeout.
func TestUDPSessionsAnswerFromTheServiceAddressAndExpireWhenIdle(t *testing.T) {
	b, err := New(proxy.Config{UserspaceUDPIdleTimeout: 300 * time.Millisecond}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ep := udpEcho(t)
	name := proxy.ServicePortName{Port: "dns"}
	socks, err := listenUDP()
	if err != nil {
		t.Fatal(err)
	}
	p := &udpProxy{name: name, socks: socks, bal: newFamilyBalancers(time.Now), b: b, log: b.log, idle: b.idle,
		sessions: map[netip.AddrPort]*udpSession{}}
	p.bal.v4.update([]netip.AddrPort{ep}, 0)
	for _, s := range socks {
		go p.serve(s)
	}

	svc := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(p.port()))
	ask := func(c *net.UDPConn, msg string) string {
		t.Helper()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 100)
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("no reply to %q: %v", msg, err)
		}
		if from != svc {
			t.Errorf("reply from %s, want the service address %s", from, svc)
		}
		return string(buf[:n])
	}
	c1, _ := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(svc))
	c2, _ := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(svc))
	defer c1.Close()
	defer c2.Close()
	for _, msg := range []string{"a", "b"} {
		if got := ask(c1, msg); got != "re:"+msg {
			t.Errorf("got %q", got)
		}
	}
	ask(c2, "c")
	st := b.stats.endpoint(ref(name, ep))
	if st.newConns.Load() != 2 || st.activeConns.Load() != 2 {
		t.Errorf("sessions: new %d active %d, want 2 and 2 (one per client port)", st.newConns.Load(), st.activeConns.Load())
	}
	// The proxy counts a reply's bytes after sending it: the client may
	// read it first.
	for end := time.Now().Add(2 * time.Second); st.bytes.Load() != 3+3*4 && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	if st.bytes.Load() != 3+3*4 {
		t.Errorf("bytes %d, want 15", st.bytes.Load())
	}
	counters, _ := b.EndpointCounters(&proxy.State{Endpoints: map[proxy.ServicePortName][]proxy.Endpoint{
		name: {{IP: ep.Addr(), Port: int32(ep.Port())}}}})
	if c := counters[ref(name, ep)]; c.Packets != 2 || c.Active == nil || *c.Active != 2 {
		t.Errorf("EndpointCounters: %+v, want 2 new and 2 active", c)
	}
	deadline := time.Now().Add(3 * time.Second)
	for st.activeConns.Load() != 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if st.activeConns.Load() != 0 || b.conns.len() != 0 {
		t.Errorf("after the idle timeout: %d sessions, %d sockets open", st.activeConns.Load(), b.conns.len())
	}
	if n := counterValue(t, b.stats.idleClosed.WithLabelValues("UDP")); n != 2 {
		t.Errorf("kp_userspace_idle_closed_total{protocol=\"UDP\"} = %v, want 2", n)
	}
	// The client may speak again: a new session.
	if got := ask(c1, "d"); got != "re:d" || st.newConns.Load() != 3 {
		t.Errorf("after expiry: %q, %d sessions ever", got, st.newConns.Load())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	p.stop()
	b.conns.drain(ctx)
}
