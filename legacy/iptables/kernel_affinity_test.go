package iptables

import (
	"context"
	"net"
	"net/netip"
	"os/exec"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
	"github.com/kpproxy/kp/test/netns"
)

// TestKernelAffinityEntryNamesTheEndpointThatAnswered, per flavor: a
// connection to a ClusterIP with ClientIP affinity puts its client in the
// recent list of the endpoint that accepted it, and ListAffinity lists
// that entry with the timeout's life left, and none for the others.
func TestKernelAffinityEntryNamesTheEndpointThatAnswered(t *testing.T) {
	for _, fl := range []Flavor{FlavorNFT, FlavorLegacy} {
		t.Run(string(fl), func(t *testing.T) {
			ns := testNamespace(t)
			eps := []string{"10.244.1.2:8080", "10.244.1.3:8080", "10.244.1.4:8080"}
			for _, args := range [][]string{{"link", "set", "lo", "up"}, {"addr", "add", "10.96.0.11/32", "dev", "lo"},
				{"addr", "add", "10.244.1.2/32", "dev", "lo"}, {"addr", "add", "10.244.1.3/32", "dev", "lo"}, {"addr", "add", "10.244.1.4/32", "dev", "lo"}} {
				if out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput(); err != nil {
					t.Fatalf("ip %v: %v: %s", args, err, out)
				}
			}
			var mu sync.Mutex
			accepted := map[string]int{}
			for _, a := range eps {
				netns.Serve(t, ns, a, func(net.Conn) {
					mu.Lock()
					accepted[a]++
					mu.Unlock()
				})
			}
			// No cluster CIDR: no masquerade, which would need a route out of lo.
			cfg := testConfig()
			cfg.ClusterCIDRs, cfg.IPTablesBackend = nil, string(fl)
			b, err := New(cfg, nil, WithClock(newClock().now), WithRouteLocalnet(func() error { return nil }),
				WithLocalAddrs(func() ([]netip.Addr, error) { return nil, nil }))
			if err != nil {
				t.Fatal(err)
			}
			w := newWorld()
			sticky := statetest.PortName("demo", "sticky", "http", v1.ProtocolTCP)
			w.AddService(sticky, "10.96.0.11", 80, 0, eps...)
			w.Services[sticky].AffinityTimeout = time.Hour
			st := w.Next()
			syncIn(t, ns, b, st)

			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c, err := netns.DialConn(ctx, ns, "tcp", "10.96.0.11:80")
			if err != nil {
				t.Fatal(err)
			}
			client := netip.MustParseAddrPort(c.LocalAddr().String()).Addr()
			c.Close()
			var answered string
			for deadline := time.Now().Add(5 * time.Second); answered == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				mu.Lock()
				for a := range accepted {
					answered = a
				}
				mu.Unlock()
			}
			if answered == "" {
				t.Fatal("no endpoint accepted the connection")
			}

			var entries []proxy.AffinityEntry
			inNS(t, ns, func() (err error) { entries, err = b.ListAffinity(ctx, st); return err })
			if len(entries) != 1 {
				t.Fatalf("affinity entries %+v, want one, of %s to %s", entries, client, answered)
			}
			e := entries[0]
			if e.ServicePort != sticky || e.Client != client || e.Endpoint.String() != answered || e.Expires <= 55*time.Minute || e.Expires > time.Hour {
				t.Errorf("entry %+v, want %s pinned to %s (the endpoint that answered) for about an hour", e, client, answered)
			}
		})
	}
}
