package nft

import (
	"bufio"
	"context"
	"net"
	"os/exec"
	"testing"
	"time"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
	"github.com/kpproxy/kp/test/netns"
	v1 "k8s.io/api/core/v1"
)

// TestKernelForeignFlowWithoutConntrackEntryIsLeftAlone: a TCP connection
// to a ClusterIP that is a local address (as on upstream's ipvs-mode dummy
// interface, whose connections can run without a conntrack entry), served
// by someone else, survives kp's table: a packet of it that starts a
// conntrack entry without SYN is neither DNATed to the Service's endpoint
// (whose reset would end the connection) nor rejected.
func TestKernelForeignFlowWithoutConntrackEntryIsLeftAlone(t *testing.T) {
	netns.Require(t, "conntrack")
	ns, fd := testNetns(t)
	acc := loopbackEndpoints(t, ns, []string{"10.96.0.10", "10.244.1.2"}, []string{"10.244.1.2:8080"})
	// The other proxy's server: a line echo on the ClusterIP itself.
	netns.Serve(t, ns, "10.96.0.10:80", func(c net.Conn) {
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if _, err := c.Write([]byte(line)); err != nil {
				return
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := netns.DialConn(ctx, ns, "tcp", "10.96.0.10:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	ping := func(when string) {
		t.Helper()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Write([]byte("ping\n")); err != nil {
			t.Fatalf("%s: write: %v", when, err)
		}
		if line, err := r.ReadString('\n'); err != nil || line != "ping\n" {
			t.Fatalf("%s: the connection to the other proxy's server broke: %q, %v", when, line, err)
		}
	}
	// No conntrack hook runs in the namespace before kp's table needs one:
	// the connection starts without an entry, as one IPVS serves can.
	ping("before kp")

	b, err := NewInNamespace(proxy.Config{MasqueradeBit: 14}, nil, fd)
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld()
	w.AddService(statetest.PortName("demo", "web", "http", v1.ProtocolTCP), "10.96.0.10", 80, 0, "10.244.1.2:8080")
	mustSync(t, b, w.Next())
	ping("with kp's table, the connection's first packets since")
	if out, err := exec.Command("ip", "netns", "exec", ns, "conntrack", "-D", "-p", "tcp", "--orig-dst", "10.96.0.10").CombinedOutput(); err != nil {
		t.Fatalf("conntrack -D: %v: %s", err, out)
	}
	ping("with kp's table, the entry conntrack picked up deleted")
	// A new connection is kp's: DNATed to the endpoint.
	dialN(t, ns, "10.96.0.10:80", 1)
	if got := acc.await(func(got map[string]int) bool { return got["10.244.1.2:8080"] == 1 }); got["10.244.1.2:8080"] != 1 {
		t.Fatalf("a new connection to the ClusterIP did not reach the endpoint: %v", got)
	}
}
