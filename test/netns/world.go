package netns

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Service address ranges: routed from the client to the node in every world
// (and nowhere else).
var (
	ServiceCIDR  = netip.MustParsePrefix("10.96.0.0/16")
	ServiceCIDR6 = netip.MustParsePrefix("fd00:96::/112")
)

// Interface names inside the node namespace.
const (
	BridgeName     = "kpbr0" // the pods' bridge; holds their gateway address
	ClientLinkName = "kpc0"  // the node's end of the link to the client
)

// Prefix starts the name of every namespace the harness makes:
// kpt-PID-N-ROLE, with PID the test process and N the world.
const Prefix = "kpt-"

// Options shape a world. The zero value is a node and a client without pods.
type Options struct {
	Pods int // pod namespaces to create, pod-0 … pod-(Pods-1)
	// Ports every pod's echo server listens on, IPv4 and IPv6.
	// Defaults: TCP 8080 and 8081, UDP 5353 and 5354.
	TCPPorts []int
	UDPPorts []int
}

// Pod is a pod namespace behind the node's bridge, running an echo server
// that answers with Name.
type Pod struct {
	Name  string     // pod-N: what its echo server answers with
	NS    string     // its namespace
	Index int        // N
	IP    netip.Addr // IPv4 address, 10.X.1.(10+N)
	IP6   netip.Addr // IPv6 address, fd00:X:1::(10+N)
	Veth  string     // the node's end of its veth, a port of the bridge
	Echo  *Process   // its echo server
}

// World is one node with its pods and an off-node client. Its methods are
// safe for concurrent use.
type World struct {
	t     testing.TB
	id    string // kpt-PID-N
	index int    // X in the addresses
	opts  Options
	echo  string // echo binary

	mu   sync.Mutex
	pods []*Pod
	next int      // index of the next pod
	nss  []string // every namespace made, in order
}

var worlds atomic.Int64

// NewWorld builds a world and removes it when t ends. It skips t when not
// root (see Require) and fails t if the world cannot be built.
func NewWorld(t testing.TB, opts Options) *World {
	t.Helper()
	Require(t)
	sweepOnce.Do(func() {
		for _, err := range SweepStale() {
			t.Logf("sweep stale namespaces: %v", err)
		}
	})
	if len(opts.TCPPorts) == 0 {
		opts.TCPPorts = []int{8080, 8081}
	}
	if len(opts.UDPPorts) == 0 {
		opts.UDPPorts = []int{5353, 5354}
	}
	echo, err := Build("./test/echo")
	if err != nil {
		t.Fatalf("new world: %v", err)
	}
	n := int(worlds.Add(1))
	w := &World{
		t:  t,
		id: fmt.Sprintf("%s%d-%d", Prefix, os.Getpid(), n),
		// 100…249: clear of the Service range's 96 and unique among the
		// worlds of one test process (worlds of different processes never
		// see each other's addresses anyway).
		index: 100 + (n-1)%150,
		opts:  opts,
		echo:  echo,
	}
	t.Cleanup(w.destroy)
	if err := w.build(); err != nil {
		t.Fatalf("new world %s: %v", w.id, err)
	}
	for i := 0; i < opts.Pods; i++ {
		w.AddPod()
	}
	return w
}

func (w *World) addNS(role string) (string, error) {
	name := w.id + "-" + role
	w.mu.Lock()
	w.nss = append(w.nss, name)
	w.mu.Unlock()
	if err := ip("netns", "add", name); err != nil {
		return "", err
	}
	return name, ip("-n", name, "link", "set", "lo", "up")
}

// BridgeMAC is the address of a test bridge: kind tells the bridges
// apart (0: a world's pod bridge, 1: the API server's), index the
// instance. Locally administered and unicast.
func BridgeMAC(kind, index int) string {
	return fmt.Sprintf("02:6b:70:%02x:%02x:%02x", kind, index>>8&0xff, index&0xff)
}

func (w *World) v4(subnet, host int) string { return fmt.Sprintf("10.%d.%d.%d", w.index, subnet, host) }
func (w *World) v6(subnet, host int) string {
	return fmt.Sprintf("fd00:%d:%d::%d", w.index, subnet, host)
}

func (w *World) build() error {
	node, err := w.addNS("node")
	if err != nil {
		return err
	}
	// Only inside the node namespace. Redirects are off so the client never
	// learns a route exception for a Service address that had no rule yet.
	if err := setSysctls(node,
		"net.ipv4.ip_forward", "1",
		"net.ipv6.conf.all.forwarding", "1",
		"net.ipv4.conf.all.send_redirects", "0",
		"net.ipv4.conf.default.send_redirects", "0",
		// Bridged pod-to-pod traffic must see netfilter, as every bridge
		// CNI requires, or replies from a DNATed pod skip conntrack.
		"net.bridge.bridge-nf-call-iptables", "1",
		"net.bridge.bridge-nf-call-ip6tables", "1",
	); err != nil {
		return err
	}
	cmds := [][]string{
		// Multicast snooping off: IPv6 neighbour discovery is flooded at once.
		// An address of its own: a bridge without one takes its lowest
		// port's, so a pod that joins later can change it under the
		// pods that cached the old one (KF-14: their packets then reach
		// the node as another host's, and only DNATed ones are routed).
		{"-n", node, "link", "add", BridgeName, "address", BridgeMAC(0, w.index), "type", "bridge", "mcast_snooping", "0"},
		{"-n", node, "addr", "add", w.v4(1, 1) + "/24", "dev", BridgeName},
		{"-n", node, "addr", "add", w.v6(1, 1) + "/64", "dev", BridgeName, "nodad"},
		{"-n", node, "link", "set", BridgeName, "up"},
	}
	client, err := w.addNS("client")
	if err != nil {
		return err
	}
	if err := setSysctls(client,
		"net.ipv4.ip_forward", "0",
		"net.ipv6.conf.all.forwarding", "0",
		"net.ipv4.conf.all.accept_redirects", "0",
		"net.ipv4.conf.default.accept_redirects", "0",
		"net.ipv6.conf.all.accept_redirects", "0",
		"net.ipv6.conf.default.accept_redirects", "0",
	); err != nil {
		return err
	}
	cmds = append(cmds,
		[]string{"-n", node, "link", "add", ClientLinkName, "type", "veth", "peer", "name", "eth0", "netns", client},
		[]string{"-n", node, "addr", "add", w.v4(2, 1) + "/24", "dev", ClientLinkName},
		[]string{"-n", node, "addr", "add", w.v6(2, 1) + "/64", "dev", ClientLinkName, "nodad"},
		[]string{"-n", node, "link", "set", ClientLinkName, "up"},
		[]string{"-n", client, "addr", "add", w.v4(2, 2) + "/24", "dev", "eth0"},
		[]string{"-n", client, "addr", "add", w.v6(2, 2) + "/64", "dev", "eth0", "nodad"},
		[]string{"-n", client, "link", "set", "eth0", "up"},
		// The node's default route: towards the client, which does not
		// forward. Without one, traffic to a Service address that has no
		// rule dies at route lookup before any netfilter hook sees it.
		[]string{"-n", node, "route", "add", "default", "via", w.v4(2, 2)},
		[]string{"-n", node, "-6", "route", "add", "default", "via", w.v6(2, 2)},
		[]string{"-n", client, "route", "add", ServiceCIDR.String(), "via", w.v4(2, 1)},
		[]string{"-n", client, "route", "add", w.PodCIDR().String(), "via", w.v4(2, 1)},
		[]string{"-n", client, "-6", "route", "add", ServiceCIDR6.String(), "via", w.v6(2, 1)},
		[]string{"-n", client, "-6", "route", "add", w.PodCIDR6().String(), "via", w.v6(2, 1)},
	)
	for _, c := range cmds {
		if err := ip(c...); err != nil {
			return err
		}
	}
	return nil
}

// AddPod creates the next pod namespace, plugs it into the bridge and starts
// its echo server; it returns once the server answers from the node. It fails
// the test on error.
func (w *World) AddPod() *Pod {
	w.t.Helper()
	w.mu.Lock()
	i := w.next
	w.next++
	w.mu.Unlock()
	if i > 200 {
		w.t.Fatalf("add pod: at most 200 pods per world")
	}
	p := &Pod{
		Name:  fmt.Sprintf("pod-%d", i),
		Index: i,
		IP:    netip.MustParseAddr(w.v4(1, 10+i)),
		IP6:   netip.MustParseAddr(w.v6(1, 10+i)),
		Veth:  fmt.Sprintf("kpv%d", i),
	}
	ns, err := w.addNS(fmt.Sprintf("pod%d", i))
	if err != nil {
		w.t.Fatalf("add %s: %v", p.Name, err)
	}
	p.NS = ns
	node := w.Node()
	for _, c := range [][]string{
		{"-n", node, "link", "add", p.Veth, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"-n", node, "link", "set", p.Veth, "master", BridgeName},
		// Hairpin: a pod reaching a Service that picks the pod itself gets
		// its packets back through the port they came in on.
		{"-n", node, "link", "set", p.Veth, "type", "bridge_slave", "hairpin", "on"},
		{"-n", node, "link", "set", p.Veth, "up"},
		{"-n", ns, "addr", "add", p.IP.String() + "/24", "dev", "eth0"},
		{"-n", ns, "addr", "add", p.IP6.String() + "/64", "dev", "eth0", "nodad"},
		{"-n", ns, "link", "set", "eth0", "up"},
		{"-n", ns, "route", "add", "default", "via", w.v4(1, 1)},
		{"-n", ns, "-6", "route", "add", "default", "via", w.v6(1, 1)},
	} {
		if err := ip(c...); err != nil {
			w.t.Fatalf("add %s: %v", p.Name, err)
		}
	}
	p.Echo = StartIn(w.t, ns, w.echo, "-name", p.Name,
		"-listen", portList(w.opts.TCPPorts), "-udp", portList(w.opts.UDPPorts))
	// Ready when it answers through the bridge, which also proves the wiring.
	addr := netip.AddrPortFrom(p.IP, uint16(w.opts.TCPPorts[0])).String()
	wait := 10 * time.Second
	if os.Getenv("KP_VM") == "1" {
		wait *= 4 // qemu emulates the CPU in software (test/vm)
	}
	deadline := time.Now().Add(wait)
	for {
		reply, err := Dial(node, "tcp", addr, time.Second)
		if err == nil && strings.HasPrefix(reply, p.Name+" ") {
			break
		}
		if time.Now().After(deadline) || !p.Echo.Running() {
			w.t.Fatalf("add %s: echo server at %s does not answer from the node: reply %q, err %v\n%s",
				p.Name, addr, reply, err, p.Echo.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
	w.mu.Lock()
	w.pods = append(w.pods, p)
	w.mu.Unlock()
	return p
}

// RemovePod stops a pod's echo server and deletes its veth and namespace.
func (w *World) RemovePod(p *Pod) {
	w.t.Helper()
	p.Echo.Stop()
	// Delete the veth first: a namespace's devices go away only when the
	// kernel's asynchronous namespace cleanup runs.
	if err := ip("-n", w.Node(), "link", "del", p.Veth); err != nil {
		w.t.Errorf("remove %s: %v", p.Name, err)
	}
	if err := deleteNS(p.NS); err != nil {
		w.t.Errorf("remove %s: %v", p.Name, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, q := range w.pods {
		if q == p {
			w.pods = append(w.pods[:i], w.pods[i+1:]...)
			break
		}
	}
}

func portList(ports []int) string {
	s := make([]string, len(ports))
	for i, p := range ports {
		s[i] = ":" + strconv.Itoa(p)
	}
	return strings.Join(s, ",")
}

// destroy removes every namespace the world made, killing what still runs
// in them; veths and kp's tables go with their namespaces.
func (w *World) destroy() {
	w.mu.Lock()
	nss := append([]string(nil), w.nss...)
	w.mu.Unlock()
	for i := len(nss) - 1; i >= 0; i-- {
		if err := deleteNS(nss[i]); err != nil {
			w.t.Errorf("clean up world %s: %v", w.id, err)
		}
	}
}

// Index is X in the world's addresses (10.X.1.0/24 …).
func (w *World) Index() int { return w.index }

// Node is the node namespace's name: where kp runs.
func (w *World) Node() string { return w.id + "-node" }

// Client is the off-node client namespace's name.
func (w *World) Client() string { return w.id + "-client" }

// NodeIP is the node's IPv4 address on the client link: the NodePort target.
func (w *World) NodeIP() netip.Addr { return netip.MustParseAddr(w.v4(2, 1)) }

// NodeIP6 is the node's IPv6 address on the client link.
func (w *World) NodeIP6() netip.Addr { return netip.MustParseAddr(w.v6(2, 1)) }

// ClientIP is the client's IPv4 address.
func (w *World) ClientIP() netip.Addr { return netip.MustParseAddr(w.v4(2, 2)) }

// ClientIP6 is the client's IPv6 address.
func (w *World) ClientIP6() netip.Addr { return netip.MustParseAddr(w.v6(2, 2)) }

// GatewayIP is the bridge's IPv4 address, the pods' default gateway (and
// what pods see as the source of masqueraded traffic).
func (w *World) GatewayIP() netip.Addr { return netip.MustParseAddr(w.v4(1, 1)) }

// GatewayIP6 is the bridge's IPv6 address.
func (w *World) GatewayIP6() netip.Addr { return netip.MustParseAddr(w.v6(1, 1)) }

// PodCIDR is the pods' IPv4 range, for --cluster-cidr.
func (w *World) PodCIDR() netip.Prefix { return netip.MustParsePrefix(w.v4(1, 0) + "/24") }

// PodCIDR6 is the pods' IPv6 range.
func (w *World) PodCIDR6() netip.Prefix { return netip.MustParsePrefix(w.v6(1, 0) + "/64") }

// ClusterCIDR is the value for kp's --cluster-cidr: both pod ranges.
func (w *World) ClusterCIDR() string { return w.PodCIDR().String() + "," + w.PodCIDR6().String() }

// TCPPorts and UDPPorts are the ports every pod's echo server answers on.
func (w *World) TCPPorts() []int { return w.opts.TCPPorts }
func (w *World) UDPPorts() []int { return w.opts.UDPPorts }

// Pods returns the world's pods, oldest first.
func (w *World) Pods() []*Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]*Pod(nil), w.pods...)
}

// Pod returns the pod named name (pod-N), or nil.
func (w *World) Pod(name string) *Pod {
	for _, p := range w.Pods() {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// Namespaces lists every namespace the world made (some may be removed).
func (w *World) Namespaces() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.nss...)
}

// Exec runs a command inside namespace ns and returns its combined output.
func (w *World) Exec(ns string, cmd ...string) (string, error) { return Exec(ns, cmd...) }

// Dial asks an echo server from inside namespace ns; see the package's Dial.
func (w *World) Dial(ns, network, addr string, timeout time.Duration) (string, error) {
	return Dial(ns, network, addr, timeout)
}

// HTTPGet fetches url from inside namespace ns.
func (w *World) HTTPGet(ns, url string, timeout time.Duration) (int, string, error) {
	return HTTPGet(ns, url, timeout)
}

// StartInNode runs path with args in the node namespace; see StartIn.
func (w *World) StartInNode(t testing.TB, path string, args ...string) *Process {
	t.Helper()
	return StartIn(t, w.Node(), path, args...)
}

// NFT runs the nft CLI in the node namespace and returns its stdout. Anything
// nft writes to stderr makes an error too, even with exit status 0: that is
// where it complains about what it cannot parse.
func (w *World) NFT(args ...string) (string, error) {
	return nft(w.Node(), args...)
}
