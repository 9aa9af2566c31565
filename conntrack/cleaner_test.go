package conntrack

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/proxytest"
	"github.com/kpproxy/kp/proxy/statetest"
)

func TestJudgeDeletesOnlyStaleUDPAndSCTPEntries(t *testing.T) {
	cur := testState()
	// prev had a Service that cur removed, on an address nothing reuses.
	prev := testState()
	gone := statetest.PortName("old", "legacy", "", "UDP")
	prev.Services[gone] = &proxy.ServicePort{Name: gone, ClusterIPs: proxytest.Addrs("10.96.0.99"), Port: 514, Protocol: "UDP", NodePort: 30514}
	prev.Endpoints[gone] = []proxy.Endpoint{statetest.Endpoint("10.244.5.5:514")}
	// and cur scaled a Service down to zero endpoints.
	empty := statetest.PortName("games", "empty", "", "UDP")
	for _, st := range []*proxy.State{prev, cur} {
		st.Services[empty] = &proxy.ServicePort{Name: empty, ClusterIPs: proxytest.Addrs("10.96.0.40"), Port: 9999, Protocol: "UDP"}
	}
	prev.Endpoints[empty] = []proxy.Endpoint{statetest.Endpoint("10.244.4.4:9999")}

	j := NewJudge(prev, cur, proxytest.Addrs("10.0.2.1"))
	for _, tt := range []struct {
		name   string
		f      Flow
		reason string // "" = kept
	}{
		{"udp to a ready endpoint is kept",
			flow(ProtoUDP, "10.244.9.9:40000", "10.96.0.10:53", "10.244.1.2:5353"), ""},
		{"udp to a removed endpoint is deleted",
			flow(ProtoUDP, "10.244.9.9:40000", "10.96.0.10:53", "10.244.1.99:5353"), ReasonEndpointGone},
		{"udp to a terminating endpoint that still serves is kept, as upstream (it drains)",
			flow(ProtoUDP, "10.244.9.9:40000", "10.96.0.10:53", "10.244.1.4:5353"), ""},
		{"udp to an endpoint that no longer serves is deleted",
			flow(ProtoUDP, "10.244.9.9:40000", "10.96.0.10:53", "10.244.1.5:5353"), ReasonEndpointGone},
		{"udp to a live pod on a port it no longer serves is deleted",
			flow(ProtoUDP, "10.244.9.9:40000", "10.96.0.10:53", "10.244.1.2:5354"), ReasonEndpointGone},
		{"udp that was never DNATed to a Service that now has endpoints is deleted",
			flow(ProtoUDP, "10.0.2.2:40000", "10.96.0.10:53", "10.96.0.10:53"), ReasonNotNATed},
		{"ipv6 udp to a ready endpoint is kept",
			flow(ProtoUDP, "[fd00:244::9]:40000", "[fd00:96::10]:53", "[fd00:244::2]:5353"), ""},
		{"ipv6 udp never DNATed is deleted",
			flow(ProtoUDP, "[fd00:244::9]:40000", "[fd00:96::10]:53", "[fd00:96::10]:53"), ReasonNotNATed},
		{"udp of a Service scaled to zero is deleted (upstream #139628)",
			flow(ProtoUDP, "10.244.9.9:40000", "10.96.0.40:9999", "10.244.4.4:9999"), ReasonEndpointGone},
		{"udp through a NodePort to a removed endpoint is deleted",
			flow(ProtoUDP, "10.0.2.2:40000", "10.0.2.1:30777", "10.244.2.99:7000"), ReasonEndpointGone},
		{"udp through a NodePort to the endpoint is kept",
			flow(ProtoUDP, "10.0.2.2:40000", "192.168.1.10:30777", "10.244.2.2:7000"), ""},
		{"udp to an external IP never DNATed is deleted",
			flow(ProtoUDP, "10.0.2.2:40000", "203.0.113.5:7777", "203.0.113.5:7777"), ReasonNotNATed},
		{"udp to a LoadBalancer IP to a removed endpoint is deleted",
			flow(ProtoUDP, "10.0.2.2:40000", "198.51.100.7:7777", "10.244.2.3:7000"), ReasonEndpointGone},
		{"udp to a removed Service is deleted",
			flow(ProtoUDP, "10.244.9.9:40000", "10.96.0.99:514", "10.244.5.5:514"), ReasonServiceRemoved},
		{"udp to a removed Service's NodePort is deleted",
			flow(ProtoUDP, "10.0.2.2:40000", "10.0.2.1:30514", "10.244.5.5:514"), ReasonServiceRemoved},
		{"sctp to a removed endpoint is deleted",
			flow(ProtoSCTP, "10.244.9.9:40000", "10.96.0.30:3868", "10.244.3.9:3868"), ReasonEndpointGone},
		{"sctp to its endpoint is kept",
			flow(ProtoSCTP, "10.244.9.9:40000", "10.96.0.30:3868", "10.244.3.2:3868"), ""},
		{"tcp to a removed endpoint is left to TCP",
			flow(ProtoTCP, "10.244.9.9:40000", "10.96.0.10:53", "10.244.1.99:5353"), ""},
		{"tcp never DNATed but past its first SYN is left to TCP",
			tcpFlow(tcpEstablished, "10.244.9.9:40000", "10.96.0.10:53", "10.96.0.10:53"), ""},
		{"a tcp connection attempt never DNATed is deleted (its source port would follow it past DNAT)",
			tcpFlow(tcpSynSent, "10.244.9.9:40000", "10.96.0.10:53", "10.96.0.10:53"), ReasonNotNATed},
		{"a DNATed tcp connection attempt is left to TCP",
			tcpFlow(tcpSynSent, "10.244.9.9:40000", "10.96.0.10:53", "10.244.1.2:5353"), ""},
		{"a tcp connection attempt to no Service is left alone",
			tcpFlow(tcpSynSent, "10.244.9.9:40000", "10.96.0.77:80", "10.96.0.77:80"), ""},
		{"udp that is not for a Service is kept",
			flow(ProtoUDP, "10.244.9.9:40000", "10.244.1.2:5353", "10.244.1.2:5353"), ""},
		{"udp to a node address on a port that is no NodePort is kept",
			flow(ProtoUDP, "10.0.2.2:40000", "10.0.2.1:53", "10.0.2.1:53"), ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := j.Judge(tt.f)
			if s.Stale != (tt.reason != "") || s.Reason != tt.reason {
				t.Errorf("Judge = %+v, want stale=%v reason %q", s, tt.reason != "", tt.reason)
			}
		})
	}
}

const tcpEstablished = 3

func tcpFlow(state uint8, client, dst, replySrc string) Flow {
	f := flow(ProtoTCP, client, dst, replySrc)
	f.ProtoState = state
	return f
}

func TestJudgeWithoutPreviousStateOnlyUsesCurrent(t *testing.T) {
	j := NewJudge(nil, testState(), nil)
	if s := j.Judge(flow(ProtoUDP, "10.244.9.9:40000", "10.96.0.99:514", "10.244.5.5:514")); s.Stale {
		t.Errorf("flow to an address kp never knew judged stale: %+v", s)
	}
}

// fakeConn is a conntrack table in memory.
type fakeConn struct {
	flows   []Flow
	deleted []Flow
	failOn  netip.AddrPort // Delete of a flow from this client fails
	dumpErr error
	closed  bool
}

func (c *fakeConn) Dump() ([]Flow, error) { return c.flows, c.dumpErr }
func (c *fakeConn) Delete(f Flow) error {
	if f.Orig.Src == c.failOn {
		return errors.New("netlink: operation not permitted")
	}
	c.deleted = append(c.deleted, f)
	return nil
}
func (c *fakeConn) Close() error { c.closed = true; return nil }

func newTestCleaner(conn *fakeConn) *Cleaner {
	return NewCleaner(CleanerConfig{
		Dial:       func() (Conn, error) { return conn, nil },
		LocalAddrs: func() ([]netip.Addr, error) { return proxytest.Addrs("10.0.2.1"), nil },
	})
}

func TestCleanerDeletesStaleEntriesAndCountsThem(t *testing.T) {
	conn := &fakeConn{flows: []Flow{
		flow(ProtoUDP, "10.244.9.9:40000", "10.96.0.10:53", "10.244.1.2:5353"),  // kept
		flow(ProtoUDP, "10.244.9.9:40001", "10.96.0.10:53", "10.244.1.99:5353"), // endpoint gone
		flow(ProtoUDP, "10.0.2.2:40002", "10.96.0.10:53", "10.96.0.10:53"),      // not NATed
		flow(ProtoTCP, "10.244.9.9:40003", "10.96.0.10:53", "10.244.1.99:5353"), // TCP: left alone
	}}
	c := newTestCleaner(conn)
	n, err := c.Clean(context.Background(), nil, testState())
	if err != nil || n != 2 {
		t.Fatalf("Clean = %d, %v; want 2, nil", n, err)
	}
	var got []string
	for _, f := range conn.deleted {
		got = append(got, f.Orig.Src.String())
	}
	if strings.Join(got, ",") != "10.244.9.9:40001,10.0.2.2:40002" {
		t.Errorf("deleted %v", got)
	}
	if !conn.closed {
		t.Error("connection left open")
	}
	if v := testutil.ToFloat64(c.deleted.WithLabelValues("UDP", ReasonEndpointGone)); v != 1 {
		t.Errorf("deleted{UDP,endpoint_gone} = %v, want 1", v)
	}
	if v := testutil.ToFloat64(c.deleted.WithLabelValues("UDP", ReasonNotNATed)); v != 1 {
		t.Errorf("deleted{UDP,not_nated} = %v, want 1", v)
	}
}

func TestCleanerKeepingRedirectedEntriesDeletesOnlyTheUnNATedOnes(t *testing.T) {
	conn := &fakeConn{flows: []Flow{
		flow(ProtoUDP, "10.244.9.9:40000", "10.96.0.10:53", "10.0.2.1:41234"), // redirected to kp's listener
		flow(ProtoUDP, "10.0.2.2:40002", "10.96.0.10:53", "10.96.0.10:53"),    // not NATed
	}}
	c := NewCleaner(CleanerConfig{
		Dial:           func() (Conn, error) { return conn, nil },
		LocalAddrs:     func() ([]netip.Addr, error) { return proxytest.Addrs("10.0.2.1"), nil },
		KeepRedirected: true,
	})
	n, err := c.Clean(context.Background(), nil, testState())
	if err != nil || n != 1 || conn.deleted[0].Orig.Src.String() != "10.0.2.2:40002" {
		t.Fatalf("Clean = %d, %v, deleted %v; want only the entry that is not NATed", n, err, conn.deleted)
	}
}

// sparedPort spares the entries redirected to one listener port.
type sparedPort uint16

func (p sparedPort) Redirects(f Flow) bool { return f.Reply.Src.Port() == uint16(p) }

// A draining userspace proxy hands its flows over itself: the cleaner,
// whose mode no longer keeps redirected entries, leaves those it redirects
// to, and deletes them again once nothing spares them.
func TestCleanerLeavesTheEntriesASparedPartyDeletesItself(t *testing.T) {
	conn := &fakeConn{flows: []Flow{
		flow(ProtoUDP, "10.244.9.9:40000", "10.96.0.10:53", "10.0.2.1:41234"),   // redirected to the draining listener
		flow(ProtoUDP, "10.244.9.9:40001", "10.96.0.10:53", "10.244.1.99:5353"), // endpoint gone
	}}
	c := newTestCleaner(conn)
	c.Spare(sparedPort(41234))
	if n, err := c.Clean(context.Background(), nil, testState()); err != nil || n != 1 || conn.deleted[0].Orig.Src.String() != "10.244.9.9:40001" {
		t.Fatalf("Clean = %d, %v, deleted %v; want only the entry of the gone endpoint", n, err, conn.deleted)
	}
	c.Spare(nil)
	conn.deleted = nil
	if n, err := c.Clean(context.Background(), nil, testState()); err != nil || n != 2 {
		t.Fatalf("Clean with nothing spared = %d, %v; want 2", n, err)
	}
}

func TestCleanerKeepsGoingPastAFailedDeleteAndReportsIt(t *testing.T) {
	conn := &fakeConn{
		flows: []Flow{
			flow(ProtoUDP, "10.244.9.9:40001", "10.96.0.10:53", "10.244.1.99:5353"),
			flow(ProtoUDP, "10.244.9.9:40002", "10.96.0.10:53", "10.244.1.99:5353"),
		},
		failOn: netip.MustParseAddrPort("10.244.9.9:40001"),
	}
	c := newTestCleaner(conn)
	c.Synced(context.Background(), nil, testState())
	if len(conn.deleted) != 1 {
		t.Errorf("deleted %d entries, want the one that did not fail", len(conn.deleted))
	}
	if v := testutil.ToFloat64(c.errors); v != 1 {
		t.Errorf("cleanup errors = %v, want 1", v)
	}
}

// A cleanup cut short by kp's shutdown is no failure: no error logged or
// counted (kp logged "conntrack cleanup failed" at every SIGTERM during a
// cleanup).
func TestCleanerStoppedByShutdownIsNoFailure(t *testing.T) {
	conn := &fakeConn{dumpErr: context.Canceled}
	c := newTestCleaner(conn)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c.Synced(ctx, nil, testState())
	if v := testutil.ToFloat64(c.errors); v != 0 {
		t.Errorf("cleanup errors = %v after a cleanup stopped by shutdown, want 0", v)
	}
}

// A TCP-only State is dumped when it serves a TCP address the previous one
// did not (the first sync, a Service port added or changed, new node
// addresses): connection attempts made before the rule may wait there.
func TestCleanerDumpsForTCPOnlyWhenATCPAddressIsNew(t *testing.T) {
	tcpOnly := func() *proxy.State {
		st := testState()
		for name, sp := range st.Services {
			if sp.Protocol != "TCP" {
				delete(st.Services, name)
			}
		}
		return st
	}
	prev := tcpOnly()
	var name proxy.ServicePortName
	for n := range prev.Services {
		name = n
	}
	added, changed, node, endpoints := tcpOnly(), tcpOnly(), tcpOnly(), tcpOnly()
	added.Services[statetest.PortName("new", "web", "", "TCP")] = &proxy.ServicePort{Name: statetest.PortName("new", "web", "", "TCP"), ClusterIPs: proxytest.Addrs("10.96.0.88"), Port: 80, Protocol: "TCP"}
	added.Changed = map[proxy.ServicePortName]struct{}{statetest.PortName("new", "web", "", "TCP"): {}}
	sp := *changed.Services[name]
	sp.ExternalIPs = proxytest.Addrs("203.0.113.80")
	changed.Services[name] = &sp
	changed.Changed = map[proxy.ServicePortName]struct{}{name: {}}
	node.NodeChanged = true
	endpoints.Endpoints[name] = nil
	endpoints.Changed = map[proxy.ServicePortName]struct{}{name: {}}
	for _, tt := range []struct {
		what       string
		prev, cur  *proxy.State
		wantDumped bool
	}{
		{"the first sync", nil, prev, true},
		{"a Service port added", prev, added, true},
		{"a Service port given an address", prev, changed, true},
		{"new node addresses", prev, node, true},
		{"endpoints changed only", prev, endpoints, false},
		{"nothing changed", prev, prev, false},
	} {
		t.Run(tt.what, func(t *testing.T) {
			dumped := false
			c := NewCleaner(CleanerConfig{
				Dial:       func() (Conn, error) { dumped = true; return &fakeConn{}, nil },
				LocalAddrs: func() ([]netip.Addr, error) { return nil, nil },
			})
			if _, err := c.Clean(context.Background(), tt.prev, tt.cur); err != nil {
				t.Fatal(err)
			}
			if dumped != tt.wantDumped {
				t.Errorf("dumped the table: %v, want %v", dumped, tt.wantDumped)
			}
		})
	}
}

func TestCleanerSkipsTheDumpWhenNoServiceUsesUDPOrSCTP(t *testing.T) {
	st := testState()
	for name, sp := range st.Services {
		if sp.Protocol != "TCP" {
			delete(st.Services, name)
		}
	}
	c := NewCleaner(CleanerConfig{
		Dial:       func() (Conn, error) { t.Fatal("dialed conntrack for a TCP-only State"); return nil, nil },
		LocalAddrs: func() ([]netip.Addr, error) { return nil, nil },
	})
	if n, err := c.Clean(context.Background(), st, st); n != 0 || err != nil {
		t.Errorf("Clean = %d, %v", n, err)
	}
}

// A sync whose conntrack table holds nothing that can be stale (established
// TCP, a TCP attempt that was DNATed) builds no judge: it neither indexes
// every Service nor lists the node's addresses (at 10,000 Services the
// judge cost a sync ~30 ms of CPU and 35 MB, BenchmarkCleanAfterAnEndpointChange).
func TestCleanerBuildsNoJudgeWhenNothingCanBeStale(t *testing.T) {
	established := tcpFlow(tcpEstablished, "10.244.9.9:40000", "10.96.0.10:53", "10.96.0.10:53")
	dnated := tcpFlow(tcpSynSent, "10.244.9.9:40001", "10.96.0.10:53", "10.244.1.2:5353")
	conn := &fakeConn{flows: []Flow{established, dnated}}
	listed := 0
	c := NewCleaner(CleanerConfig{Dial: func() (Conn, error) { return conn, nil },
		LocalAddrs: func() ([]netip.Addr, error) { listed++; return proxytest.Addrs("10.0.2.1"), nil }})
	if n, err := c.Clean(context.Background(), nil, testState()); err != nil || n != 0 {
		t.Fatalf("Clean = %d, %v; want 0, nil", n, err)
	}
	if listed != 0 {
		t.Errorf("the node's addresses listed %d times for a table with nothing to judge, want 0", listed)
	}
	// One UDP entry: now there is something to judge.
	conn.flows = append(conn.flows, flow(ProtoUDP, "10.244.9.9:40002", "10.96.0.10:53", "10.244.1.99:5353"))
	if n, err := c.Clean(context.Background(), nil, testState()); err != nil || n != 1 {
		t.Fatalf("Clean with a stale UDP entry = %d, %v; want 1, nil", n, err)
	}
	if listed != 1 {
		t.Errorf("the node's addresses listed %d times, want 1", listed)
	}
}
