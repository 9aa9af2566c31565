package ipvs

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
	"github.com/kpproxy/kp/test/netns"
)

// inVM skips t outside the VM: the host's kernel has no IPVS
// (TestVMRunsTheKernelTests boots the 6.1 kernel and runs them there).
func inVM(t *testing.T) {
	t.Helper()
	if os.Getenv("KP_VM") != "1" {
		t.Skip("skipped: needs IPVS, runs inside the VM (TestVMRunsTheKernelTests boots it)")
	}
}

// kworld is a node namespace with a client (10.1.0.2, routed to the
// Service range through the node) and pods (10.2.N.2, each on its own
// link to the node), each pod serving TCP 8080: every line read on a
// connection is answered with the pod's name, until the client closes.
type kworld struct {
	t      *testing.T
	node   string
	client string
	pods   []string
	podIPs []netip.Addr
}

func newKWorld(t *testing.T, pods int) *kworld {
	t.Helper()
	w := &kworld{t: t, node: netns.NewNamespace(t, "ipvsnode"), client: netns.NewNamespace(t, "ipvscl")}
	must := func(args ...string) {
		t.Helper()
		if err := netns.IP(args...); err != nil {
			t.Fatal(err)
		}
	}
	must("-n", w.node, "link", "add", "kpc0", "type", "veth", "peer", "name", "eth0", "netns", w.client)
	must("-n", w.node, "addr", "add", "10.1.0.1/24", "dev", "kpc0")
	must("-n", w.node, "link", "set", "kpc0", "up")
	must("-n", w.client, "addr", "add", "10.1.0.2/24", "dev", "eth0")
	must("-n", w.client, "link", "set", "eth0", "up")
	must("-n", w.client, "route", "add", "10.96.0.0/16", "via", "10.1.0.1")
	must("-n", w.client, "route", "add", "10.1.0.0/16", "via", "10.1.0.1") // NodePorts on other node addresses
	for i := 0; i < pods; i++ {
		ns := netns.NewNamespace(t, fmt.Sprintf("ipvspod%d", i))
		link := fmt.Sprintf("kpv%d", i)
		ip := netip.MustParseAddr(fmt.Sprintf("10.2.%d.2", i))
		must("-n", w.node, "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns)
		must("-n", w.node, "addr", "add", fmt.Sprintf("10.2.%d.1/24", i), "dev", link)
		must("-n", w.node, "link", "set", link, "up")
		must("-n", ns, "addr", "add", ip.String()+"/24", "dev", "eth0")
		must("-n", ns, "link", "set", "eth0", "up")
		must("-n", ns, "route", "add", "default", "via", fmt.Sprintf("10.2.%d.1", i))
		w.serve(ns, fmt.Sprintf("pod-%d", i))
		w.pods = append(w.pods, ns)
		w.podIPs = append(w.podIPs, ip)
	}
	if _, err := netns.Exec(w.node, "sysctl", "-qw", "net.ipv4.ip_forward=1"); err != nil {
		t.Fatal(err)
	}
	return w
}

// serve answers every line on every connection to ns's TCP 8080 with name.
func (w *kworld) serve(ns, name string) {
	netns.Serve(w.t, ns, "0.0.0.0:8080", func(c net.Conn) {
		r := bufio.NewReader(c)
		for {
			if _, err := r.ReadString('\n'); err != nil {
				return
			}
			if _, err := c.Write([]byte(name + "\n")); err != nil {
				return
			}
		}
	})
}

// conn is an open client connection to a Service.
type conn struct {
	c net.Conn
	r *bufio.Reader
}

func (w *kworld) dial(addr string) (*conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := netns.DialConn(ctx, w.client, "tcp4", addr)
	if err != nil {
		return nil, err
	}
	return &conn{c: c, r: bufio.NewReader(c)}, nil
}

// ask sends a line and returns the pod's answer.
func (c *conn) ask() (string, error) {
	_ = c.c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.c.Write([]byte("?\n")); err != nil {
		return "", err
	}
	line, err := c.r.ReadString('\n')
	return strings.TrimSpace(line), err
}

// askOnce opens a connection, asks, and closes it.
func (w *kworld) askOnce(addr string) (string, error) {
	c, err := w.dial(addr)
	if err != nil {
		return "", err
	}
	defer c.c.Close()
	return c.ask()
}

// in runs fn in the node namespace.
func (w *kworld) in(fn func() error) {
	w.t.Helper()
	if err := netns.InNamespace(w.node, fn); err != nil {
		w.t.Fatal(err)
	}
}

// kstate is a World on node-1 (10.1.0.1), with one ClusterIP Service per
// call to add, its endpoints on node-1.
type kstate struct{ *statetest.World }

func newKState() *kstate {
	return &kstate{statetest.New(statetest.Node("node-1", "10.1.0.1"), statetest.EndpointsOn("node-1"))}
}

// add adds the service port ns/name (TCP) with endpoints eps, port 8080.
func (k *kstate) add(name, clusterIP string, port, nodePort int32, eps ...netip.Addr) proxy.ServicePortName {
	n := statetest.PortName("ns", name, "", v1.ProtocolTCP)
	k.AddService(n, clusterIP, port, nodePort)
	k.setEndpoints(n, eps...)
	return n
}

// setEndpoints sets n's endpoints to eps, port 8080.
func (k *kstate) setEndpoints(n proxy.ServicePortName, eps ...netip.Addr) {
	var out []string
	for _, a := range eps {
		out = append(out, netip.AddrPortFrom(a, 8080).String())
	}
	k.SetEndpoints(n, out...)
}

func kernelConfig(sched string) proxy.Config {
	return proxy.Config{Mode: proxy.ModeIPVS, MasqueradeBit: 14, IPTablesBackend: "nft",
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.2.0.0/16")},
		IPVS:         proxy.IPVSConfig{Scheduler: sched, TCPFinTimeout: time.Second}}
}
