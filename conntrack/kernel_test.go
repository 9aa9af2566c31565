package conntrack_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/conntrack"
	"github.com/kpproxy/kp/nft"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/proxytest"
	"github.com/kpproxy/kp/proxy/statetest"
	"github.com/kpproxy/kp/test/netns"
)

func TestMain(m *testing.M) { os.Exit(netns.Main(m)) }

// kernelWorld is a test/netns world whose node runs kp's nftables backend
// (in this process, through a namespace fd) with one UDP Service.
type kernelWorld struct {
	w       *netns.World
	fd      int
	backend *nft.Backend
	name    proxy.ServicePortName
	st      *statetest.World
}

const kernelClusterIP = "10.96.0.53"

func newKernelWorld(t *testing.T, pods int) *kernelWorld {
	t.Helper()
	w := netns.NewWorld(t, netns.Options{Pods: pods})
	fd, err := unix.Open("/run/netns/"+w.Node(), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	b, err := nft.NewInNamespace(proxy.Config{MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{w.PodCIDR()}}, nil, fd)
	if err != nil {
		t.Fatal(err)
	}
	name := statetest.PortName("e2e", "dns", "dns", v1.ProtocolUDP)
	st := statetest.New(statetest.Node("node", w.NodeIP().String()), statetest.EndpointsOn("node"))
	st.Services[name] = &proxy.ServicePort{
		Name: name, Type: v1.ServiceTypeClusterIP, ClusterIPs: proxytest.Addrs(kernelClusterIP), Port: 53, Protocol: v1.ProtocolUDP,
	}
	return &kernelWorld{w: w, fd: fd, backend: b, name: name, st: st}
}

// sync programs the Service with pods as its endpoints and returns the State.
func (k *kernelWorld) sync(t *testing.T, pods ...*netns.Pod) *proxy.State {
	t.Helper()
	var eps []string
	for _, p := range pods {
		eps = append(eps, netip.AddrPortFrom(p.IP, uint16(k.w.UDPPorts()[0])).String())
	}
	k.st.SetEndpoints(k.name, eps...)
	st := k.st.Next()
	if err := k.backend.Sync(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	return st
}

// udpClient is a connected UDP socket in the client namespace: every
// exchange uses the same source port, hence the same conntrack entry.
func (k *kernelWorld) udpClient(t *testing.T) net.Conn {
	t.Helper()
	c, err := netns.DialConn(context.Background(), k.w.Client(), "udp", kernelClusterIP+":53")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func exchange(c net.Conn) (string, error) {
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("?\n")); err != nil {
		return "", err
	}
	buf := make([]byte, 256)
	n, err := c.Read(buf)
	if err != nil {
		return "", err
	}
	name, _ := netns.ParseReply(string(buf[:n]))
	return name, nil
}

func (k *kernelWorld) dump(t *testing.T) []conntrack.Flow {
	t.Helper()
	conn, err := conntrack.Dialer{NetNS: k.fd}.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	flows, err := conn.Dump()
	if err != nil {
		t.Fatal(err)
	}
	return flows
}

func (k *kernelWorld) localAddrs(t *testing.T) []netip.Addr {
	t.Helper()
	var out []netip.Addr
	if err := netns.InNamespace(k.w.Node(), func() error {
		var err error
		out, err = proxy.LocalAddrs()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// flowFrom finds the flow whose original source is src.
func flowFrom(flows []conntrack.Flow, src netip.AddrPort) (conntrack.Flow, bool) {
	for _, f := range flows {
		if f.Orig.Src == src {
			return f, true
		}
	}
	return conntrack.Flow{}, false
}

func TestKernelDumpAttributesARealUDPFlowWithCounters(t *testing.T) {
	k := newKernelWorld(t, 1)
	pod := k.w.Pods()[0]
	if err := netns.InNamespace(k.w.Node(), func() error {
		conntrack.EnableAccounting(slog.New(slog.DiscardHandler))
		if !conntrack.AccountingEnabled() {
			return fmt.Errorf("nf_conntrack_acct still off")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	st := k.sync(t, pod)
	c := k.udpClient(t)
	for i := 0; i < 3; i++ {
		if name, err := exchange(c); err != nil || name != pod.Name {
			t.Fatalf("exchange %d: %q, %v", i, name, err)
		}
	}
	src := netip.MustParseAddrPort(c.LocalAddr().String())
	f, ok := flowFrom(k.dump(t), src)
	if !ok {
		t.Fatalf("no conntrack entry from %s in the node namespace", src)
	}
	a, ok := conntrack.NewIndex(st, k.localAddrs(t)).Attribute(f)
	wantEP := netip.AddrPortFrom(pod.IP, uint16(k.w.UDPPorts()[0]))
	if !ok || a.ServicePort != k.name || a.Via != conntrack.ViaClusterIP || a.Endpoint != wantEP || !a.Known {
		t.Errorf("attribution %+v, want %s via ClusterIP to %s", a, k.name, wantEP)
	}
	if f.State() != "ASSURED" && f.State() != "REPLIED" {
		t.Errorf("state %s after three exchanges, want REPLIED or ASSURED", f.State())
	}
	if f.OrigPackets != 3 || f.ReplyPackets != 3 || f.OrigBytes == 0 {
		t.Errorf("counters orig %d/%dB reply %d/%dB, want 3 packets each way", f.OrigPackets, f.OrigBytes, f.ReplyPackets, f.ReplyBytes)
	}
	if f.Start.IsZero() || f.Age(time.Now()) < 0 || f.Age(time.Now()) > time.Minute {
		t.Errorf("start %v: want a timestamp (nf_conntrack_timestamp on)", f.Start)
	}
}

func TestKernelEventsStreamNewAndDestroyedFlows(t *testing.T) {
	k := newKernelWorld(t, 2)
	pods := k.w.Pods()
	k.sync(t, pods[0])
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := make(chan conntrack.Event, 64)
	watchErr := make(chan error, 1)
	go func() { watchErr <- conntrack.Dialer{NetNS: k.fd}.Watch(ctx, events) }()

	// Events flow only once the subscription is in place: retry the first
	// exchange on fresh sockets until one shows up as new.
	var src netip.AddrPort
	deadline := time.After(10 * time.Second)
	var c net.Conn
wait:
	for {
		c = k.udpClient(t)
		if _, err := exchange(c); err != nil {
			t.Fatal(err)
		}
		src = netip.MustParseAddrPort(c.LocalAddr().String())
		for {
			select {
			case e := <-events:
				if e.Type == conntrack.EventNew && e.Flow.Orig.Src == src {
					break wait
				}
				continue
			case <-time.After(500 * time.Millisecond):
			case <-deadline:
				t.Fatal("no new-flow event")
			}
			break
		}
	}

	// The endpoint goes away: the cleaner deletes the entry, which the
	// stream reports as destroyed.
	prev := k.sync(t, pods[0])
	cur := k.sync(t, pods[1])
	cleaner := conntrack.NewCleaner(conntrack.CleanerConfig{
		Dial:       conntrack.Dialer{NetNS: k.fd}.Open,
		LocalAddrs: func() ([]netip.Addr, error) { return k.localAddrs(t), nil },
	})
	n, err := cleaner.Clean(context.Background(), prev, cur)
	if err != nil || n < 1 {
		t.Fatalf("Clean = %d, %v; want the stale entry deleted", n, err)
	}
	for {
		select {
		case e := <-events:
			if e.Type == conntrack.EventDestroy && e.Flow.Orig.Src == src {
				// And the same socket now reaches the new endpoint.
				if name, err := exchange(c); err != nil || name != pods[1].Name {
					t.Errorf("after cleanup: %q, %v; want %s", name, err, pods[1].Name)
				}
				cancel()
				if err := <-watchErr; err != nil {
					t.Errorf("Watch: %v", err)
				}
				return
			}
		case err := <-watchErr:
			t.Fatalf("Watch ended: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("no destroy event for the deleted entry")
		}
	}
}

// TestKernelTCPAttemptBeforeItsServiceDoesNotBlockItsSourcePort: a client
// tries a ClusterIP before the Service has a rule; its SYN is forwarded
// (nowhere), and the node's conntrack keeps the attempt, never DNATed, for
// two minutes. Once the Service is synced, a new connection from the same
// source port (ports are reused) would match that entry and go past DNAT
// to the reject rule: refused. The cleaner deletes the attempt's entry on
// the sync that adds the Service, and the connection gets through.
func TestKernelTCPAttemptBeforeItsServiceDoesNotBlockItsSourcePort(t *testing.T) {
	k := newKernelWorld(t, 1)
	pod := k.w.Pods()[0]
	const clusterIP, port = "10.96.0.80", 80
	name := statetest.PortName("e2e", "web", "http", v1.ProtocolTCP)
	sp := &proxy.ServicePort{Name: name, Type: v1.ServiceTypeClusterIP, ClusterIPs: proxytest.Addrs(clusterIP), Port: port, Protocol: v1.ProtocolTCP}
	node := proxy.Node{Name: "node", IPs: []netip.Addr{k.w.NodeIP()}}
	empty := &proxy.State{Generation: 1, Services: map[proxy.ServicePortName]*proxy.ServicePort{},
		Endpoints: map[proxy.ServicePortName][]proxy.Endpoint{}, Node: node}
	if err := k.backend.Sync(context.Background(), empty); err != nil {
		t.Fatal(err)
	}
	src := netip.AddrPortFrom(k.w.ClientIP(), 40123)
	dial := func(timeout time.Duration) (string, error) {
		reply, err := netns.DialFromPort(k.w.Client(), src, net.JoinHostPort(clusterIP, fmt.Sprint(port)), timeout)
		name, _ := netns.ParseReply(reply)
		return name, err
	}
	if name, err := dial(1500 * time.Millisecond); err == nil {
		t.Fatalf("connected to %s (%s) before the Service had a rule", clusterIP, name)
	}
	f, ok := flowFrom(k.dump(t), src)
	if !ok || f.State() != "SYN_SENT" || f.DNATed() {
		t.Fatalf("the attempt left %+v (found %v) in the node's conntrack, want a SYN_SENT entry never DNATed", f, ok)
	}

	withWeb := &proxy.State{Generation: 2,
		Services:  map[proxy.ServicePortName]*proxy.ServicePort{name: sp},
		Endpoints: map[proxy.ServicePortName][]proxy.Endpoint{name: {proxy.Endpoint{IP: pod.IP, Port: int32(k.w.TCPPorts()[0]), Ready: true, Serving: true}.At("node", "")}},
		Changed:   map[proxy.ServicePortName]struct{}{name: {}},
		Node:      node,
	}
	if err := k.backend.Sync(context.Background(), withWeb); err != nil {
		t.Fatal(err)
	}
	cleaner := conntrack.NewCleaner(conntrack.CleanerConfig{
		Dial:       conntrack.Dialer{NetNS: k.fd}.Open,
		LocalAddrs: func() ([]netip.Addr, error) { return k.localAddrs(t), nil },
	})
	if n, err := cleaner.Clean(context.Background(), empty, withWeb); err != nil || n != 1 {
		t.Errorf("Clean = %d, %v; want the attempt's entry deleted", n, err)
	}
	if name, err := dial(5 * time.Second); err != nil || name != pod.Name {
		t.Errorf("from the same source port once the Service is synced: %q, %v; want %s", name, err, pod.Name)
	}
}
