package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kpproxy/kp/conntrack"
	"github.com/kpproxy/kp/proxy/statusapi"
	"github.com/kpproxy/kp/test/netns"
)

// udpClient is a UDP client that keeps one source port, as a DNS resolver or
// a statsd sender does, and sends a request every 100 ms, like the client
// of upstream's e2e "Conntrack" tests. Every reply and every error it sees
// is recorded with its time.
type udpClient struct {
	conn   net.Conn
	cancel context.CancelFunc
	done   sync.WaitGroup

	mu     sync.Mutex
	events []udpEvent
}

// udpEvent is one outcome: a reply from pod From, or an error.
type udpEvent struct {
	At   time.Time
	From string
	Err  error
}

func (e udpEvent) refused() bool { return errors.Is(e.Err, syscall.ECONNREFUSED) }

// startUDPClient starts sending from namespace ns to addr until the test ends.
func (e *env) startUDPClient(ns, addr string) *udpClient {
	e.t.Helper()
	conn, err := netns.DialConn(context.Background(), ns, "udp", addr)
	if err != nil {
		e.t.Fatalf("udp client in %s: %v", ns, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &udpClient{conn: conn, cancel: cancel}
	e.t.Cleanup(c.stop)
	c.done.Add(2)
	go func() {
		defer c.done.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			if _, err := conn.Write([]byte("?\n")); err != nil && ctx.Err() == nil {
				// A connected UDP socket reports a pending ICMP error on
				// the next send as well as on the next receive.
				c.record(udpEvent{At: time.Now(), Err: err})
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	go func() {
		defer c.done.Done()
		buf := make([]byte, 512)
		for ctx.Err() == nil {
			_ = conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			n, err := conn.Read(buf)
			switch {
			case ctx.Err() != nil:
				return
			case errors.Is(err, os.ErrDeadlineExceeded):
			case err != nil:
				c.record(udpEvent{At: time.Now(), Err: err})
			default:
				name, _ := netns.ParseReply(string(buf[:n]))
				c.record(udpEvent{At: time.Now(), From: name})
			}
		}
	}()
	return c
}

func (c *udpClient) record(ev udpEvent) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events = append(c.events, ev)
}

func (c *udpClient) stop() {
	c.cancel()
	c.conn.Close()
	c.done.Wait()
}

// source is the client's address and port: its conntrack entry's origin.
func (c *udpClient) source() netip.AddrPort {
	return netip.MustParseAddrPort(c.conn.LocalAddr().String())
}

// since returns the events from t on.
func (c *udpClient) since(t time.Time) []udpEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []udpEvent
	for _, ev := range c.events {
		if !ev.At.Before(t) {
			out = append(out, ev)
		}
	}
	return out
}

// waitFor waits until an event since t satisfies ok, failing the test with
// a summary of what the client saw after timeout.
func (e *env) waitFor(c *udpClient, what string, t time.Time, timeout time.Duration, ok func(udpEvent) bool) udpEvent {
	e.t.Helper()
	var found udpEvent
	e.eventually(what, timeout, func() error {
		evs := c.since(t)
		for _, ev := range evs {
			if ok(ev) {
				found = ev
				return nil
			}
		}
		return fmt.Errorf("the client saw %s", summarize(evs))
	})
	return found
}

// summarize counts events by outcome: "pod-0 ×12, connection refused ×3".
func summarize(evs []udpEvent) string {
	counts := map[string]int{}
	var order []string
	for _, ev := range evs {
		k := ev.From
		if ev.Err != nil {
			k = ev.Err.Error()
		}
		if counts[k] == 0 {
			order = append(order, k)
		}
		counts[k]++
	}
	if len(order) == 0 {
		return "nothing"
	}
	s := ""
	for i, k := range order {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%s ×%d", k, counts[k])
	}
	return s
}

// conntrackFrom dumps the node's conntrack table and returns the entries
// whose original source is src.
func (e *env) conntrackFrom(src netip.AddrPort) []conntrack.Flow {
	e.t.Helper()
	fd, err := unix.Open("/run/netns/"+e.w.Node(), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		e.t.Fatal(err)
	}
	defer unix.Close(fd)
	conn, err := conntrack.Dialer{NetNS: fd}.Open()
	if err != nil {
		e.t.Fatal(err)
	}
	defer conn.Close()
	flows, err := conn.Dump()
	if err != nil {
		e.t.Fatal(err)
	}
	var out []conntrack.Flow
	for _, f := range flows {
		if f.Orig.Src == src {
			out = append(out, f)
		}
	}
	return out
}

// statusClient reads kp's status API on its socket.
func (e *env) statusClient() *statusapi.Client {
	return statusapi.SocketClient(e.socket)
}

// metric returns the /metrics text of kp.
func (e *env) metrics() string {
	e.t.Helper()
	code, body, err := e.w.HTTPGet(e.w.Node(), "http://"+metricsAddr+"/metrics", 5*time.Second)
	if err != nil || code != 200 {
		e.t.Fatalf("GET /metrics: %d %v", code, err)
	}
	return body
}

// nodeHTTP is an HTTP client whose connections start in the node namespace.
func (e *env) nodeHTTP() *http.Client {
	ns := e.w.Node()
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		Proxy:             nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return netns.DialConn(ctx, ns, network, addr)
		},
	}}
}
