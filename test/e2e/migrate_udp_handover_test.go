package e2e

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/test/netns"
)

// A switch away from the userspace mode loses no UDP request, not even one
// that is with the endpoint while kp switches, from a client that sends
// its next request the moment it has an answer. The endpoint takes 150 ms
// to answer, so a request is with it nearly all the time: the conntrack
// cleaner deleted the flow's redirect entry under it, and the answer left
// the listener untranslated, which the client drops (KF-1 in
// docs/known-flakes.md). The draining proxy now hands the flow over
// itself when it is idle, and sends on through the new mode a datagram
// that reached it after (legacy/userspace/handover.go).
func TestMigrateNodeFromUserspaceLosesNoUDPRequestWithTheEndpoint(t *testing.T) {
	t.Parallel()
	skipUnselected(t, modeUserspace)
	for _, to := range []mode{modeNFTables, modeIPTablesNFT} {
		t.Run("userspace-to-"+to.name, func(t *testing.T) {
			skipUnselected(t, to)
			e := newEnv(t, modeUserspace, 2)
			server, client := e.w.Pods()[0], e.w.Pods()[1]
			serveSlowUDP(t, server.NS, ":5360", 150*time.Millisecond)
			e.write("slow.yaml", Service{Name: "slow", ClusterIPs: []string{"10.96.0.20"},
				Ports:     []Port{{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, TargetPort: 5360}},
				Endpoints: endpoints(server)})
			e.startKP()
			c := startAskingUDP(t, client.NS, "10.96.0.20:53")
			e.eventually("the slow UDP Service answers", 15*time.Second, func() error {
				if c.answered() < 3 {
					return fmt.Errorf("%d answers", c.answered())
				}
				return nil
			})
			e.migrate("--to", to.name)
			time.Sleep(slow(6 * time.Second)) // past the drain's end (drainDelay)
			lost, answered := c.stop()
			if len(lost) > 0 {
				t.Fatalf("%d of %d requests lost across the switch to %s: %s\nkp's log:\n%s", len(lost), answered+len(lost), to.name,
					strings.Join(lost, "; "), tail(e.kp.Log(), 40))
			}
			if n := e.metric(`kp_userspace_udp_handovers_total{result="handed_over"}`); n < 1 {
				t.Errorf("kp_userspace_udp_handovers_total{result=\"handed_over\"} = %v, want ≥ 1 (the flow was handed over by the drain)", n)
			}
			t.Logf("%d requests answered across the switch", answered)
		})
	}
}

// serveSlowUDP answers each datagram at addr in namespace ns with itself
// after delay.
func serveSlowUDP(t *testing.T, ns, addr string, delay time.Duration) {
	t.Helper()
	var pc net.PacketConn
	if err := netns.InNamespace(ns, func() (err error) { pc, err = net.ListenPacket("udp", addr); return err }); err != nil {
		t.Fatalf("listen on udp %s in %s: %v", addr, ns, err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			msg := append([]byte(nil), buf[:n]...)
			time.AfterFunc(delay, func() { _, _ = pc.WriteTo(msg, from) })
		}
	}()
}

// askingUDP sends numbered requests from one socket, each the moment the
// one before is answered (or, lost, after 2 s).
type askingUDP struct {
	cancel context.CancelFunc
	done   sync.WaitGroup
	mu     sync.Mutex
	n      int
	lost   []string
}

func startAskingUDP(t *testing.T, ns, addr string) *askingUDP {
	t.Helper()
	conn, err := netns.DialConn(context.Background(), ns, "udp", addr)
	if err != nil {
		t.Fatalf("udp client in %s: %v", ns, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &askingUDP{cancel: cancel}
	t.Cleanup(func() { c.stop() })
	c.done.Add(1)
	go func() {
		defer c.done.Done()
		defer conn.Close()
		buf := make([]byte, 512)
		for i := 0; ctx.Err() == nil; i++ {
			req := fmt.Sprintf("request-%d", i)
			sent := time.Now()
			_, err := conn.Write([]byte(req))
			for err == nil {
				_ = conn.SetReadDeadline(sent.Add(2 * time.Second))
				var n int
				if n, err = conn.Read(buf); err == nil && string(buf[:n]) == req {
					break
				}
			}
			c.mu.Lock()
			if err != nil {
				c.lost = append(c.lost, fmt.Sprintf("%s at %s: %v", req, sent.Format("15:04:05.000"), err))
			} else {
				c.n++
			}
			c.mu.Unlock()
		}
	}()
	return c
}

func (c *askingUDP) answered() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// stop ends the requests and returns the lost ones and how many were
// answered.
func (c *askingUDP) stop() (lost []string, answered int) {
	c.cancel()
	c.done.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lost, c.n
}
