package userspace

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kpproxy/kp/proxy"
)

// counterValue reads a Prometheus counter.
func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// tcpEcho answers each line on loopback with the line, until the client
// closes.
func tcpEcho(t *testing.T) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if err != nil { // EMFILE in TestOutOfFileDescriptorsIsSaidClearly
				time.Sleep(10 * time.Millisecond)
				continue
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// loopbackTCPProxy runs one TCP listener of a backend configured by cfg on
// loopback (no redirect), proxying to ep; it returns the backend and the
// listener's address.
func loopbackTCPProxy(t *testing.T, cfg proxy.Config, ep netip.AddrPort) (*Backend, string) {
	t.Helper()
	b, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	// The test dials the listener itself, which only a redirect does in
	// production: in a namespace where conntrack tracks, that is refused.
	b.ops.redirected = func(*net.TCPConn) error { return nil }
	p := &tcpProxy{name: proxy.ServicePortName{Port: "http"}, ln: ln, bal: newFamilyBalancers(time.Now), b: b,
		log: b.log, close: make(chan struct{})}
	p.bal.v4.update([]netip.AddrPort{ep}, 0)
	go p.serve()
	t.Cleanup(p.stop)
	return b, ln.Addr().String()
}

// echoOnce sends a line on c and reads it back.
func echoOnce(c net.Conn, r *bufio.Reader, line string) error {
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := fmt.Fprintln(c, line); err != nil {
		return err
	}
	got, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if got != line+"\n" {
		return fmt.Errorf("echo %q, want %q", got, line)
	}
	return nil
}

func TestTCPConnectionsOverTheCapAreResetAtOnceAndCounted(t *testing.T) {
	b, addr := loopbackTCPProxy(t, proxy.Config{UserspaceMaxConnections: 2}, tcpEcho(t))
	var open []net.Conn
	for i := range 2 {
		c, err := net.Dial("tcp4", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := echoOnce(c, bufio.NewReader(c), fmt.Sprint("conn ", i)); err != nil {
			t.Fatalf("connection %d under the cap: %v", i, err)
		}
		open = append(open, c)
	}
	// The third: accepted by the kernel, then reset by the proxy at once
	// (on loopback the reset may beat connect's return).
	start := time.Now()
	c, err := net.Dial("tcp4", addr)
	if err == nil {
		err = echoOnce(c, bufio.NewReader(c), "over")
		c.Close()
	}
	if err == nil || time.Since(start) > time.Second {
		t.Errorf("a connection over the cap of 2: %v after %v, want an error at once", err, time.Since(start))
	}
	if n := counterValue(t, b.stats.refused.WithLabelValues("TCP")); n != 1 {
		t.Errorf("kp_userspace_refused_connections_total = %v, want 1", n)
	}
	// One closes: there is room again.
	open[0].Close()
	var err2 error
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		var c net.Conn
		if c, err2 = net.Dial("tcp4", addr); err2 == nil {
			err2 = echoOnce(c, bufio.NewReader(c), "room")
			c.Close()
		}
		if err2 == nil {
			break
		}
	}
	if err2 != nil {
		t.Errorf("after a connection closed, a new one: %v", err2)
	}
}

func TestTCPConnectionIdleBothWaysIsClosedAndAnActiveOneIsNot(t *testing.T) {
	const idle = 400 * time.Millisecond
	b, addr := loopbackTCPProxy(t, proxy.Config{UserspaceTCPIdleTimeout: idle}, tcpEcho(t))
	quiet, err := net.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer quiet.Close()
	busy, err := net.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	qr, br := bufio.NewReader(quiet), bufio.NewReader(busy)
	if err := echoOnce(quiet, qr, "hello"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	closed := make(chan time.Duration, 1)
	go func() {
		quiet.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := qr.ReadString('\n')
		if err == nil {
			closed <- -1
			return
		}
		closed <- time.Since(start)
	}()
	// The busy one talks every 100 ms for 4 idle timeouts.
	for i := 0; time.Since(start) < 4*idle; i++ {
		if err := echoOnce(busy, br, fmt.Sprint("tick ", i)); err != nil {
			t.Fatalf("the active connection after %v: %v", time.Since(start), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	select {
	case took := <-closed:
		if took < idle || took > 2*idle {
			t.Errorf("the idle connection closed after %v, want within [%v, %v]", took, idle, 2*idle)
		}
	default:
		t.Errorf("the connection idle for %v is still open", time.Since(start))
	}
	if n := counterValue(t, b.stats.idleClosed.WithLabelValues("TCP")); n != 1 {
		t.Errorf("kp_userspace_idle_closed_total{protocol=\"TCP\"} = %v, want 1", n)
	}
}
