package bench

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kpproxy/kp/test/netns"
)

// switchClient is the client of a restart or a take-over (SwitchClient):
// new connections one after the other to the sampled ClusterIPs, and one
// long-lived connection to Service bulk that sends a little every
// longLivedEvery.
type switchClient struct {
	started time.Time
	loop    *netns.Loop
	long    net.Conn
	sent    atomic.Int64
	stopW   chan struct{}
	wrote   chan error
	// answerWait bounds the wait for the sink's count at the end.
	answerWait time.Duration
}

const (
	// switchPause is the wait between two new connections: a steady
	// trickle (a few hundred a second) that sees a gap of a few
	// milliseconds without loading the machine the proxy starts on.
	switchPause = 2 * time.Millisecond
	// switchSlow bounds a new connection's answer: over it, it counts as
	// failed though it got through. Well over a loaded machine's delays
	// (netns.SlowConnect's 900 ms fails connections of a busy 2-core
	// machine); a lost SYN is counted by the kernel's own count anyway.
	switchSlow = 2500 * time.Millisecond
	// longLivedEvery is how often the long-lived connection sends.
	longLivedEvery = 20 * time.Millisecond
	// switchLead and switchTail are the client's window before the switch
	// begins and after it ended.
	switchLead, switchTail = 500 * time.Millisecond, 500 * time.Millisecond
)

// startSwitchClient starts the client in namespace ns: new connections to
// addrs (each must be answered by a pod), the long-lived one to bulk.
func startSwitchClient(ns string, addrs []string, bulk string) (*switchClient, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	long, err := netns.DialConn(ctx, ns, "tcp", bulk)
	if err != nil {
		return nil, fmt.Errorf("the long-lived connection to %s: %w", bulk, err)
	}
	s := &switchClient{started: time.Now(), long: long, stopW: make(chan struct{}), wrote: make(chan error, 1), answerWait: 10 * time.Second}
	s.loop = netns.StartLoop(netns.LoopSpec{
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return netns.DialConn(ctx, ns, network, addr)
		},
		Addrs:   addrs,
		Timeout: 2 * switchSlow,
		Pause:   switchPause,
		Slow:    switchSlow,
		Check: func(reply string) error {
			if !strings.HasPrefix(reply, "pod-") {
				return fmt.Errorf("answered %q, not by a pod", reply)
			}
			return nil
		},
	})
	go func() {
		buf := make([]byte, 512)
		tick := time.NewTicker(longLivedEvery)
		defer tick.Stop()
		for {
			select {
			case <-s.stopW:
				s.wrote <- nil
				return
			case <-tick.C:
			}
			_ = long.SetWriteDeadline(time.Now().Add(5 * time.Second))
			n, err := long.Write(buf)
			s.sent.Add(int64(n))
			if err != nil {
				s.wrote <- err
				return
			}
		}
	}()
	return s, nil
}

// stop ends the client and says what it saw; a failure's line says when
// it came from switchAt, the new proxy's start. The long-lived connection is
// half-closed; the sink answers with the bytes it received, which must be
// every byte sent (a connection a switch broke is reset, or its bytes
// never arrive and the answer does not come within 10 s).
func (s *switchClient) stop(switchAt time.Time) SwitchClient {
	sum := s.loop.Stop()
	close(s.stopW)
	werr := <-s.wrote
	out := SwitchClient{Attempts: len(sum.Attempts), Failed: len(sum.Failures), Seconds: time.Since(s.started).Seconds(),
		LongLivedBytes: s.sent.Load(), LongLivedRetransmits: netns.Retransmits(s.long)}
	for _, a := range sum.Attempts {
		if f := a.Failure(sum.Bound); f != "" && len(out.Failures) < 5 {
			out.Failures = append(out.Failures, fmt.Sprintf("%+.3f s from the proxy's start: %s", a.At.Sub(switchAt).Seconds(), f))
		}
	}
	defer s.long.Close()
	if werr != nil {
		out.LongLived = "send: " + werr.Error()
		return out
	}
	if err := s.long.(*net.TCPConn).CloseWrite(); err != nil {
		out.LongLived = "half-close: " + err.Error()
		return out
	}
	_ = s.long.SetReadDeadline(time.Now().Add(s.answerWait))
	line, err := bufio.NewReader(s.long).ReadString('\n')
	got, perr := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
	switch {
	case err != nil:
		out.LongLived = fmt.Sprintf("no count from the sink after %d bytes sent: %v", out.LongLivedBytes, err)
	case perr != nil || got != out.LongLivedBytes:
		out.LongLived = fmt.Sprintf("the sink counted %q of %d bytes sent", strings.TrimSpace(line), out.LongLivedBytes)
	}
	return out
}

// The restart and take-over phases judge a proxy by what their client
// counts: through rules that stay, it counts nothing failed; when the rules
// and the connections' conntrack entries go in its window, it counts the
// new connections that failed and the long-lived connection as broken.
func TestBenchSwitchClientCountsFailuresWhenTheRulesGo(t *testing.T) {
	netns.Require(t, "nft", "conntrack")
	w := netns.NewWorld(t, netns.Options{Pods: 1, TCPPorts: []int{podPort}, UDPPorts: []int{5353}})
	pod := w.Pods()[0]
	startSink(t, pod.NS)
	if err := netns.IP("-n", w.Client(), "route", "add", serviceRange.String(), "via", w.NodeIP().String()); err != nil {
		t.Fatal(err)
	}
	vip := serviceRange.Addr().Next().String()
	rules := fmt.Sprintf(`table ip kp-bench-switch {
	chain pre { type nat hook prerouting priority -100;
		ip daddr %[1]s tcp dport %[2]d dnat to %[3]s:%[4]d
		ip daddr %[1]s tcp dport %[5]d dnat to %[3]s:%[6]d
	}
}`, vip, servicePort, pod.IP, podPort, bulkPort, sinkPort)
	if out, err := netns.Exec(w.Node(), "nft", rules); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	addrs := []string{net.JoinHostPort(vip, strconv.Itoa(servicePort))}
	bulk := net.JoinHostPort(vip, strconv.Itoa(bulkPort))
	run := func(during func()) SwitchClient {
		cl, err := startSwitchClient(w.Client(), addrs, bulk)
		if err != nil {
			t.Fatal(err)
		}
		cl.answerWait = 2 * time.Second
		time.Sleep(300 * time.Millisecond)
		during()
		time.Sleep(time.Second)
		return cl.stop(time.Now())
	}
	if got := run(func() {}); !got.ok() || got.Attempts < 10 || got.LongLivedBytes <= 0 {
		t.Errorf("through rules that stay: %s %v; want at least 10 connections, none failed, and the long-lived one held", got, got.Failures)
	}
	got := run(func() {
		if out, err := netns.Exec(w.Node(), "nft", "delete", "table", "ip", "kp-bench-switch"); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		flushConntrack(w.Node())
	})
	if got.Failed == 0 || got.LongLived == "" {
		t.Errorf("with the rules and conntrack gone in its window: %s; want failed new connections and the long-lived one broken", got)
	}
	t.Logf("with the rules gone: %s; first failure %v", got, got.Failures[:min(1, len(got.Failures))])
}
