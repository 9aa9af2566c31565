package nft

import (
	"context"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
	"github.com/kpproxy/kp/test/netns"
)

// TestKernelAffinityEntryNamesTheEndpointThatAnswered: a connection to a
// ClusterIP with ClientIP affinity leaves its client in the affinity set
// of the endpoint that accepted it, and ListAffinity lists that entry
// with the timeout's life left, and none for the other endpoints.
func TestKernelAffinityEntryNamesTheEndpointThatAnswered(t *testing.T) {
	ns, fd := testNetns(t)
	b, err := NewInNamespace(proxy.Config{MasqueradeBit: 14}, nil, fd)
	if err != nil {
		t.Fatal(err)
	}
	eps := []string{"10.244.1.2:8080", "10.244.1.3:8080", "10.244.1.4:8080"}
	acc := loopbackEndpoints(t, ns, []string{"10.96.0.11", "10.244.1.2", "10.244.1.3", "10.244.1.4"}, eps)
	w := newWorld()
	sticky := statetest.PortName("demo", "sticky", "http", v1.ProtocolTCP)
	w.AddService(sticky, "10.96.0.11", 80, 0, eps...)
	w.Services[sticky].AffinityTimeout = time.Hour
	st := w.Next()
	mustSync(t, b, st)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := netns.DialConn(ctx, ns, "tcp", "10.96.0.11:80")
	if err != nil {
		t.Fatal(err)
	}
	client := netip.MustParseAddrPort(c.LocalAddr().String()).Addr()
	c.Close()
	got := acc.await(func(n map[string]int) bool { return len(n) == 1 })
	var answered string
	for a := range got {
		answered = a
	}
	if len(got) != 1 {
		t.Fatalf("connections accepted %v, want one", got)
	}

	entries, err := b.ListAffinity(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Fatalf("affinity entries %+v, want one, of %s to %s", entries, client, answered)
	}
	e := entries[0]
	if e.ServicePort != sticky || e.Client != client || e.Endpoint.String() != answered || e.Expires <= 55*time.Minute || e.Expires > time.Hour {
		t.Errorf("entry %+v, want %s pinned to %s (the endpoint that answered) for about an hour", e, client, answered)
	}
}
