package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/test/netns"
)

// dnsService is a UDP-only Service, 53 → the pods' 5353.
func dnsService(name, clusterIP string, nodePort int32, pods ...*netns.Pod) Service {
	svc := Service{
		Name:       name,
		ClusterIPs: []string{clusterIP},
		Ports:      []Port{{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, TargetPort: 5353, NodePort: nodePort}},
		Endpoints:  endpoints(pods...),
	}
	if nodePort != 0 {
		svc.Type = v1.ServiceTypeNodePort
	}
	return svc
}

// deletedEntries reads kp_conntrack_entries_deleted_total for a UDP reason.
func (e *env) deletedEntries(reason string) int { return e.deletedEntriesOf("UDP", reason) }

// deletedEntriesOf reads kp_conntrack_entries_deleted_total for a protocol
// and reason.
func (e *env) deletedEntriesOf(protocol, reason string) int {
	e.t.Helper()
	re := regexp.MustCompile(`kp_conntrack_entries_deleted_total\{protocol="` + protocol + `",reason="` + reason + `"\} (\d+)`)
	m := re.FindStringSubmatch(e.metrics())
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// After upstream's e2e "should be able to preserve UDP traffic when server
// pod cycles for a ClusterIP service" and "... for a NodePort service": a
// client that keeps its source port keeps one conntrack entry alive as long
// as it sends; without cleanup that entry points at the first pod forever.
func TestUDPClientFollowsItsServerPodWhenThePodIsReplaced(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		nodePort int32
	}{{"ClusterIP", 0}, {"NodePort", 30053}} {
		t.Run(c.name, func(t *testing.T) {
			forEachMode(t, func(t *testing.T, m mode) {
				e := newEnv(t, m, 1)
				old := e.w.Pods()[0]
				e.write("dns.yaml", dnsService("dns", "10.96.0.53", c.nodePort, old))
				e.startKP()
				addr := "10.96.0.53:53"
				if c.nodePort != 0 {
					addr = hostPort(e.w.NodeIP().String(), int(c.nodePort))
				}
				client := e.startUDPClient(e.w.Client(), addr)
				e.waitFor(client, "answers from "+old.Name, time.Time{}, 15*time.Second,
					func(ev udpEvent) bool { return ev.From == old.Name })

				// The pod dies: the Service has no endpoint. The client's entry
				// must go (upstream #139628), so its packets meet the reject
				// rule instead of vanishing towards the dead pod's address.
				gone := time.Now()
				e.write("dns.yaml", dnsService("dns", "10.96.0.53", c.nodePort))
				e.w.RemovePod(old)
				e.waitFor(client, "refused while the Service has no endpoint", gone, 15*time.Second,
					func(ev udpEvent) bool { return ev.refused() })

				// A new pod at a new address becomes the endpoint.
				fresh := e.w.AddPod()
				back := time.Now()
				e.write("dns.yaml", dnsService("dns", "10.96.0.53", c.nodePort, fresh))
				e.waitFor(client, "answers from the new pod "+fresh.Name, back, 15*time.Second,
					func(ev udpEvent) bool { return ev.From == fresh.Name })
				if n := e.deletedEntries("endpoint_gone"); n < 1 && m.claims(featureStaleUDPByKP) {
					t.Errorf("kp_conntrack_entries_deleted_total{reason=endpoint_gone} = %d, want at least 1", n)
				}
				t.Logf("client saw: %s", summarize(client.since(time.Time{})))
			})
		})
	}
}

// The same with no gap: a rolling update replaces the endpoint in one step.
func TestUDPClientFollowsARollingReplacement(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 2)
		pods := e.w.Pods()
		e.write("dns.yaml", dnsService("dns", "10.96.0.53", 0, pods[0]))
		e.startKP()
		client := e.startUDPClient(pods[1].NS, "10.96.0.53:53")
		e.waitFor(client, "answers from pod-0", time.Time{}, 15*time.Second, func(ev udpEvent) bool { return ev.From == pods[0].Name })
		fresh := e.w.AddPod()
		switched := time.Now()
		e.write("dns.yaml", dnsService("dns", "10.96.0.53", 0, fresh))
		e.w.RemovePod(pods[0])
		e.waitFor(client, "answers from "+fresh.Name, switched, 15*time.Second, func(ev udpEvent) bool { return ev.From == fresh.Name })
	})
}

// A UDP client that started while its Service had no endpoints, and keeps
// its source port, gets answers once the first endpoint appears.
//
// What the kernel does (checked below): kp rejects a new packet to a
// Service without endpoints in the filter hooks. A rejected packet is
// dropped before conntrack confirms its entry, so the unconfirmed entry dies
// with the packet: there is nothing stale to clean, and the first packet
// after the sync that adds an endpoint is new and DNATed.
//
// The entry that does blackhole (upstream #48370, and the entries upstream
// #139628 leaves behind) is one the kernel confirmed without DNAT: a packet
// sent before kp had any rule for the address is routed on (here to the
// client, which drops it) and confirmed. Every later packet of the flow
// matches that entry, skips the NAT hook (it only sees new flows) and the
// reject (it only looks at new flows), and refreshes the 30 s UDP timeout:
// with one packet per 100 ms it never expires. Only deleting it helps.
func TestUDPClientThatStartedBeforeTheFirstEndpointGetsAnswers(t *testing.T) {
	t.Parallel()
	t.Run("Service without endpoints: rejected, nothing confirmed", func(t *testing.T) {
		forEachMode(t, func(t *testing.T, m mode) {
			e := newEnv(t, m, 1)
			pod := e.w.Pods()[0]
			e.write("dns.yaml", dnsService("dns", "10.96.0.53", 0))
			e.startKP()
			client := e.startUDPClient(e.w.Client(), "10.96.0.53:53")
			e.waitFor(client, "refused", time.Time{}, 15*time.Second, func(ev udpEvent) bool { return ev.refused() })
			if flows := e.conntrackFrom(client.source()); len(flows) != 0 {
				t.Errorf("rejected packets left conntrack entries: %+v", flows)
			}
			first := time.Now()
			e.write("dns.yaml", dnsService("dns", "10.96.0.53", 0, pod))
			e.waitFor(client, "answers after the first endpoint appeared", first, 15*time.Second,
				func(ev udpEvent) bool { return ev.From == pod.Name })
		})
	})

	t.Run("Service address kp had no rule for yet: confirmed without DNAT, deleted", func(t *testing.T) {
		forEachMode(t, func(t *testing.T, m mode) {
			e := newEnv(t, m, 1)
			pod := e.w.Pods()[0]
			e.write("other.yaml", dnsService("other", "10.96.0.54", 0, pod))
			e.startKP()
			client := e.startUDPClient(e.w.Client(), "10.96.0.53:53")
			var stale string
			e.eventually("the client's packets confirm an entry without DNAT", 15*time.Second, func() error {
				for _, f := range e.conntrackFrom(client.source()) {
					if !f.DNATed() && f.Orig.Dst.String() == "10.96.0.53:53" {
						stale = fmt.Sprintf("%s %s→%s reply from %s", f.State(), f.Orig.Src, f.Orig.Dst, f.Reply.Src)
						return nil
					}
				}
				return fmt.Errorf("no such entry yet")
			})
			t.Logf("entry before the Service exists: %s", stale)
			if evs := client.since(time.Time{}); len(evs) != 0 {
				t.Errorf("the client got %s before the Service existed, want silence", summarize(evs))
			}

			first := time.Now()
			e.write("dns.yaml", dnsService("dns", "10.96.0.53", 0, pod))
			e.waitFor(client, "answers after the Service appeared with an endpoint", first, 15*time.Second,
				func(ev udpEvent) bool { return ev.From == pod.Name })
			if n := e.deletedEntries("not_nated"); n < 1 {
				t.Errorf("kp_conntrack_entries_deleted_total{reason=not_nated} = %d, want at least 1", n)
			}
		})
	})
}

// tcpService is a TCP-only Service, 80 → the pods' 8080.
func tcpService(name, clusterIP string, pods ...*netns.Pod) Service {
	return Service{Name: name, ClusterIPs: []string{clusterIP},
		Ports: []Port{{Name: "http", Port: 80, TargetPort: 8080}}, Endpoints: endpoints(pods...)}
}

// A TCP client that tried a ClusterIP before it had a rule left an entry of
// its attempt (SYN_SENT, never DNATed) that lasts two minutes; a new
// connection from the same source port matches it, and its SYN passes
// DNAT: refused. kp deletes the attempt's entry on the sync that adds the
// Service (a TCP-only one: the table is dumped for it), and exactly one
// connection from that port then gets through. (Retrying would hide the
// bug: a refused SYN leaves the entry CLOSE, which the next SYN replaces.)
func TestTCPClientThatTriedBeforeTheServiceConnectsFromTheSamePort(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 1)
		pod := e.w.Pods()[0]
		e.write("other.yaml", tcpService("other", "10.96.0.56", pod))
		e.startKP()
		e.answers(e.w.Client(), "tcp", "10.96.0.56:80")
		src := netip.AddrPortFrom(e.w.ClientIP(), 40123)
		dial := func(timeout time.Duration) (string, error) {
			reply, err := netns.DialFromPort(e.w.Client(), src, "10.96.0.55:80", timeout)
			name, _ := netns.ParseReply(reply)
			return name, err
		}
		if name, err := dial(1500 * time.Millisecond); err == nil {
			t.Fatalf("connected (to %s) before the Service existed", name)
		}
		e.eventually("the attempt's entry, never DNATed, in the node's conntrack", 5*time.Second, func() error {
			for _, f := range e.conntrackFrom(src) {
				if !f.DNATed() && f.State() == "SYN_SENT" {
					return nil
				}
			}
			return fmt.Errorf("none: %+v", e.conntrackFrom(src))
		})

		e.write("web.yaml", tcpService("web", "10.96.0.55", pod))
		e.eventually("kp to delete the attempt's entry", 15*time.Second, func() error {
			if n := e.deletedEntriesOf("TCP", "not_nated"); n < 1 {
				return fmt.Errorf("kp_conntrack_entries_deleted_total{protocol=TCP,reason=not_nated} = %d", n)
			}
			return nil
		})
		if name, err := dial(5 * time.Second); err != nil || name != pod.Name {
			t.Errorf("one connection from the attempt's source port once the Service exists: %q, %v; want %s", name, err, pod.Name)
		}
	})
}

// TCP is left to its own state machine: the entry of a connection to a
// removed endpoint is not deleted by kp.
func TestTCPConnectionsAreNotTouchedByConntrackCleanup(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 2)
		pods := e.w.Pods()
		e.write("web.yaml", web(pods[0]))
		e.startKP()
		e.answers(e.w.Client(), "tcp", webTCP)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := netns.DialConn(ctx, e.w.Client(), "tcp", webTCP)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		src := netip.MustParseAddrPort(conn.LocalAddr().String())
		udp := e.startUDPClient(e.w.Client(), webUDP)
		e.waitFor(udp, "udp answers from pod-0", time.Time{}, 15*time.Second, func(ev udpEvent) bool { return ev.From == pods[0].Name })

		switched := time.Now()
		e.write("web.yaml", web(pods[1]))
		// The UDP client's entry had to be deleted for it to reach pod-1: the
		// cleanup after the switch has run.
		e.waitFor(udp, "udp answers from pod-1", switched, 15*time.Second, func(ev udpEvent) bool { return ev.From == pods[1].Name })
		if !m.claims(featureConntrackNAT) {
			// No entry to look at: the connection itself still delivers
			// pod-0's answer after the switch (a sync closes no TCP
			// connection of the proxy's).
			conn.SetDeadline(time.Now().Add(5 * time.Second))
			if reply, err := bufio.NewReader(conn).ReadString('\n'); err != nil || !strings.HasPrefix(reply, pods[0].Name+" ") {
				t.Errorf("the TCP connection to the removed endpoint %s: %q %v", pods[0].Name, reply, err)
			}
			return
		}
		found := false
		for _, f := range e.conntrackFrom(src) {
			if f.Reply.Src.Addr() == pods[0].IP {
				found = true
				t.Logf("TCP entry kept: %s %s→%s reply from %s", f.State(), f.Orig.Src, f.Orig.Dst, f.Reply.Src)
			}
		}
		if !found {
			t.Errorf("the TCP entry of a connection to the removed endpoint %s was deleted", pods[0].Name)
		}
	})
}
