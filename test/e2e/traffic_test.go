package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kpproxy/kp/test/netns"
)

// traffic is what runs through a migration: loops of new TCP connections
// (netns.Loops: one that needed its SYN sent again fails), each from its
// namespace to its Services, one long-lived TCP connection that exchanges a
// line every 50 ms (a stream), and a UDP flow (one socket, so one conntrack
// entry) that asks every 50 ms. Every failure is recorded.
type traffic struct {
	t      *testing.T
	cancel context.CancelFunc
	wg     sync.WaitGroup

	loops   []*namedLoop
	long    *stream
	capture *resetCapture

	mu        sync.Mutex
	udpAsked  int
	failedUDP []string
}

// flows says where a traffic's parts go: each loop from its namespace to
// its addresses in turn, the long-lived connection and the UDP flow each
// from one namespace to one address.
type flows struct {
	loops  []loopFlow
	stream flowTo
	udp    flowTo
	// capture: the namespace (the node's) whose TCP resets and ICMP
	// errors a failure of the traffic names (resetCapture); none if "".
	capture string
}

// loopFlow is one loop of new connections: from namespace ns to addrs in
// turn; name says which in messages ("pod to ClusterIPs").
type loopFlow struct {
	name, ns string
	addrs    []string
}

type flowTo struct{ ns, addr string }

type namedLoop struct {
	name string
	loop *netns.Loop
}

// streamServer listens on port 9090 inside pod ns and echoes every line
// back on the same connection for as long as the client keeps it open (the
// echo server answers once and closes).
func streamServer(t *testing.T, p *netns.Pod) {
	t.Helper()
	netns.Serve(t, p.NS, ":9090", func(c net.Conn) {
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if _, err := fmt.Fprintf(c, "%s %s", p.Name, line); err != nil {
				return
			}
		}
	})
}

// startTraffic starts the loops from namespace ns: new connections to each
// of tcpAddrs in turn, the long-lived connection to streamAddr, the UDP
// flow to udpAddr.
func startTraffic(t *testing.T, ns string, tcpAddrs []string, streamAddr, udpAddr string) *traffic {
	return startFlows(t, flows{loops: []loopFlow{{name: "from " + ns, ns: ns, addrs: tcpAddrs}},
		stream: flowTo{ns, streamAddr}, udp: flowTo{ns, udpAddr}})
}

// startFlows starts f's loops, its long-lived connection and its UDP flow.
func startFlows(t *testing.T, f flows) *traffic {
	ctx, cancel := context.WithCancel(context.Background())
	tr := &traffic{t: t, cancel: cancel}
	udp, err := netns.DialConn(ctx, f.udp.ns, "udp", f.udp.addr)
	if err != nil {
		t.Fatalf("UDP flow to %s: %v", f.udp.addr, err)
	}
	// How long a UDP answer or a ping on the long-lived connection may
	// take before it counts as lost: under the VM's emulation a loaded host
	// stalls its CPUs for seconds (slow).
	if f.capture != "" {
		tr.capture = startResetCapture(f.capture)
		t.Cleanup(func() { tr.capture.stop() })
	}
	wait := slow(3 * time.Second)
	tr.long = startStream(t, f.stream.ns, f.stream.addr, wait)
	for _, lf := range f.loops {
		// New connections, one every 20 ms, each answered within
		// netns.SlowConnect or counted as failed: the timeout only lets a
		// slow one be measured.
		tr.loops = append(tr.loops, &namedLoop{name: lf.name, loop: netns.StartLoop(netns.LoopSpec{
			Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return netns.DialConn(ctx, lf.ns, network, addr)
			},
			Addrs:   lf.addrs,
			Timeout: wait,
			// In the VM, whose emulated CPUs stall under load, the
			// latency bound is looser; a lost SYN still fails there by
			// the kernel's own retransmission count
			// (Attempt.SYNRetransmits).
			Slow:  slow(netns.SlowConnect),
			Pause: 20 * time.Millisecond,
		})})
	}
	tr.wg.Add(1)
	go tr.askUDP(ctx, udp, wait)
	return tr
}

// askUDP is the UDP flow: a request every 50 ms on one socket, each
// answered within wait or recorded as lost.
func (tr *traffic) askUDP(ctx context.Context, udp net.Conn, wait time.Duration) {
	defer tr.wg.Done()
	defer udp.Close()
	for ctx.Err() == nil {
		start := time.Now()
		rctx, rcancel := context.WithTimeout(ctx, wait)
		_, err := netns.Ask(rctx, udp)
		rcancel()
		if ctx.Err() != nil {
			return
		}
		tr.mu.Lock()
		tr.udpAsked++
		if err != nil {
			tr.failedUDP = append(tr.failedUDP, fmt.Sprintf("%s: %v", start.Format("15:04:05.000"), err))
		}
		tr.mu.Unlock()
		time.Sleep(50 * time.Millisecond)
	}
}

// counts is how far each part of the traffic got: attempts per loop, then
// pings on the long-lived connection, then UDP requests.
func (tr *traffic) counts() []int {
	var n []int
	for _, l := range tr.loops {
		n = append(n, len(l.loop.Attempts()))
	}
	tr.long.mu.Lock()
	n = append(n, len(tr.long.pongs))
	tr.long.mu.Unlock()
	tr.mu.Lock()
	n = append(n, tr.udpAsked)
	tr.mu.Unlock()
	return n
}

// flowing waits until every part of the traffic has made k more exchanges
// (new connections, pings, UDP requests) than when it was called: the
// traffic demonstrably runs through the mode of that moment, whatever the
// machine's speed.
func (tr *traffic) flowing(k int) {
	tr.t.Helper()
	before := tr.counts()
	deadline := time.Now().Add(slow(10 * time.Second))
	for {
		now, behind := tr.counts(), -1
		for i := range now {
			if now[i] < before[i]+k {
				behind = i
			}
		}
		if behind < 0 {
			return
		}
		if time.Now().After(deadline) {
			tr.t.Fatalf("the traffic stalled: %v exchanges per part, %v before (loops, long-lived pings, UDP requests)", now, before)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop ends the loops and reports every failure as a test error; the long-
// lived connection must still be open (unless allowLongLivedLoss says why
// it cannot be).
func (tr *traffic) stop(allowLongLivedLoss string) {
	tr.t.Helper()
	tr.stopSince(time.Time{}, allowLongLivedLoss)
}

// stopSince is stop counting only the new connections started at or after
// since (the UDP flow and the long-lived connection count throughout).
func (tr *traffic) stopSince(since time.Time, allowLongLivedLoss string) {
	t := tr.t
	t.Helper()
	tr.cancel()
	var sums []netns.Summary
	for _, l := range tr.loops {
		sums = append(sums, l.loop.Stop().Since(since))
	}
	from, pongs, longErr := tr.long.stop()
	tr.wg.Wait()
	for i, l := range tr.loops {
		t.Logf("traffic %s: %s", l.name, sums[i])
		if err := sums[i].Err(); err != nil {
			t.Errorf("%s: %v", l.name, err)
		}
	}
	t.Logf("traffic: %d pings on the long-lived connection to %s, %d UDP requests on one flow (%d unanswered)",
		len(pongs), from, tr.udpAsked, len(tr.failedUDP))
	if len(tr.failedUDP) > 0 {
		t.Errorf("%d of %d UDP requests on the flow were not answered, first %s\n%s", len(tr.failedUDP), tr.udpAsked, tr.failedUDP[0], strings.Join(tr.failedUDP, "\n"))
	}
	switch {
	case longErr != nil && allowLongLivedLoss == "":
		t.Errorf("the long-lived connection broke: %v", longErr)
	case longErr != nil:
		t.Logf("the long-lived connection ended, as expected (%s): %v", allowLongLivedLoss, longErr)
	case len(pongs) < 10:
		t.Errorf("the long-lived connection carried only %d pings", len(pongs))
	}
	if lines := tr.capture.stop(); t.Failed() && tr.capture != nil {
		t.Log(tr.capture.summary(lines))
	}
}

// stream is one long-lived TCP connection to streamServers that exchanges
// a line every 50 ms and must stay with the endpoint that answered first;
// its first failure ends it.
type stream struct {
	conn   net.Conn
	done   chan struct{}
	mu     sync.Mutex
	from   string      // the endpoint that answered first
	pongs  []time.Time // when each answer came
	err    error
	closed bool
}

// startStream opens the connection to addr from namespace ns; wait bounds
// each exchange.
func startStream(t *testing.T, ns, addr string, wait time.Duration) *stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	conn, err := netns.DialConn(ctx, ns, "tcp", addr)
	if err != nil {
		t.Fatalf("long-lived connection to %s: %v", addr, err)
	}
	s := &stream{conn: conn, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		r := bufio.NewReader(conn)
		for i := 0; ; i++ {
			_ = conn.SetDeadline(time.Now().Add(wait))
			if _, err := fmt.Fprintf(conn, "ping %d\n", i); err != nil {
				s.fail(fmt.Errorf("%s ping %d: %w", time.Now().Format("15:04:05.000"), i, err))
				return
			}
			line, err := r.ReadString('\n')
			if err != nil {
				s.fail(fmt.Errorf("%s pong %d: %w", time.Now().Format("15:04:05.000"), i, err))
				return
			}
			from, _, _ := strings.Cut(line, " ")
			s.mu.Lock()
			if s.from == "" {
				s.from = from
			}
			moved := from != s.from
			s.pongs = append(s.pongs, time.Now())
			s.mu.Unlock()
			if moved {
				s.fail(fmt.Errorf("%s pong %d: the connection moved from %s to %s", time.Now().Format("15:04:05.000"), i, s.from, from))
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	return s
}

// fail records the connection's first failure, unless stop closed it.
func (s *stream) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil && !s.closed {
		s.err = err
	}
}

// stop closes the connection and returns the endpoint that answered, when
// each answer came and the first failure.
func (s *stream) stop() (from string, pongs []time.Time, err error) {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.conn.Close()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.from, s.pongs, s.err
}
