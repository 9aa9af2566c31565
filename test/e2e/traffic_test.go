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

// traffic is what runs through a migration: a loop of new TCP
// connections to several Services, one long-lived TCP connection that
// exchanges a line every 50 ms, and a UDP flow (one socket, so one
// conntrack entry) that asks every 50 ms. Every failure is recorded.
type traffic struct {
	t      *testing.T
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu                          sync.Mutex
	newConns, udpAsked, pings   int
	failedConns, failedUDP      []string
	longLivedErr                error
	longLivedFrom, longLivedVia string
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
	ctx, cancel := context.WithCancel(context.Background())
	tr := &traffic{t: t, cancel: cancel}
	long, err := netns.DialConn(ctx, ns, "tcp", streamAddr)
	if err != nil {
		t.Fatalf("long-lived connection to %s: %v", streamAddr, err)
	}
	udp, err := netns.DialConn(ctx, ns, "udp", udpAddr)
	if err != nil {
		t.Fatalf("UDP flow to %s: %v", udpAddr, err)
	}
	// How long an answer may take before it counts as lost: a dropped SYN
	// is sent again after 1 s, so only a connection the path refuses or
	// loses for good fails; under the VM's emulation a loaded host stalls
	// its CPUs for seconds (slow).
	wait := slow(3 * time.Second)
	tr.wg.Add(3)
	go func() { // new connections, one every 20 ms
		defer tr.wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			addr := tcpAddrs[i%len(tcpAddrs)]
			start := time.Now()
			_, err := netns.Dial(ns, "tcp", addr, wait)
			tr.mu.Lock()
			tr.newConns++
			if err != nil {
				tr.failedConns = append(tr.failedConns, fmt.Sprintf("%s %s: %v (after %v)", start.Format("15:04:05.000"), addr, err, time.Since(start).Round(time.Millisecond)))
			}
			tr.mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()
	go func() { // the long-lived connection
		defer tr.wg.Done()
		defer long.Close()
		r := bufio.NewReader(long)
		for i := 0; ctx.Err() == nil; i++ {
			_ = long.SetDeadline(time.Now().Add(wait))
			if _, err := fmt.Fprintf(long, "ping %d\n", i); err != nil {
				tr.setLongErr(fmt.Errorf("%s ping %d: %w", time.Now().Format("15:04:05.000"), i, err))
				return
			}
			line, err := r.ReadString('\n')
			if err != nil {
				tr.setLongErr(fmt.Errorf("%s pong %d: %w", time.Now().Format("15:04:05.000"), i, err))
				return
			}
			from, _, _ := strings.Cut(line, " ")
			tr.mu.Lock()
			tr.pings++
			if tr.longLivedFrom == "" {
				tr.longLivedFrom = from
			} else if from != tr.longLivedFrom {
				tr.longLivedErr = fmt.Errorf("the connection moved from %s to %s", tr.longLivedFrom, from)
			}
			tr.mu.Unlock()
			time.Sleep(50 * time.Millisecond)
		}
	}()
	go func() { // the UDP flow
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
	}()
	return tr
}

func (tr *traffic) setLongErr(err error) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.longLivedErr == nil {
		tr.longLivedErr = err
	}
}

// stop ends the loops and reports every failure as a test error; the long-
// lived connection must still be open (unless allowLongLivedLoss says why
// it cannot be).
func (tr *traffic) stop(allowLongLivedLoss string) {
	t := tr.t
	t.Helper()
	tr.mu.Lock()
	longErr := tr.longLivedErr
	tr.mu.Unlock()
	tr.cancel()
	tr.wg.Wait()
	t.Logf("traffic: %d new connections (%d failed), %d pings on the long-lived connection to %s, %d UDP requests on one flow (%d unanswered)",
		tr.newConns, len(tr.failedConns), tr.pings, tr.longLivedFrom, tr.udpAsked, len(tr.failedUDP))
	if len(tr.failedConns) > 0 {
		// The first failure on the message's first line: a digest of the
		// output (test/failures.sh) keeps only that.
		t.Errorf("%d of %d new connections failed, first %s\n%s", len(tr.failedConns), tr.newConns, tr.failedConns[0], strings.Join(tr.failedConns, "\n"))
	}
	if len(tr.failedUDP) > 0 {
		t.Errorf("%d of %d UDP requests on the flow were not answered, first %s\n%s", len(tr.failedUDP), tr.udpAsked, tr.failedUDP[0], strings.Join(tr.failedUDP, "\n"))
	}
	switch {
	case longErr != nil && allowLongLivedLoss == "":
		t.Errorf("the long-lived connection broke: %v", longErr)
	case longErr != nil:
		t.Logf("the long-lived connection ended, as expected (%s): %v", allowLongLivedLoss, longErr)
	case tr.pings < 10:
		t.Errorf("the long-lived connection carried only %d pings", tr.pings)
	}
}
