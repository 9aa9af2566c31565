package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/kpproxy/kp/proxy"
)

// TestKernelAffinityEntryNamesTheEndpointThatAnswered: a connection to a
// ClusterIP with ClientIP affinity makes IPVS a persistence template of
// the client and the virtual server naming the real server that
// answered, and ListAffinity lists it with that endpoint and the timeout's
// life left.
func TestKernelAffinityEntryNamesTheEndpointThatAnswered(t *testing.T) {
	inVM(t)
	w := newKWorld(t, 3)
	b := newKernelBackend(t, kernelConfig("rr"), &recording{})
	k := newKState()
	web := k.add("web", "10.96.0.10", 80, 0, w.podIPs...)
	k.Services[web].AffinityTimeout = time.Hour
	st := k.Next()
	w.in(func() error { return b.Probe(context.Background()) })
	w.sync(b, st)
	c, err := w.dial("10.96.0.10:80")
	if err != nil {
		t.Fatal(err)
	}
	client := netip.MustParseAddrPort(c.c.LocalAddr().String()).Addr()
	name, err := c.ask()
	c.c.Close()
	if err != nil {
		t.Fatal(err)
	}
	var answered string
	for i, ip := range w.podIPs {
		if name == fmt.Sprintf("pod-%d", i) {
			answered = netip.AddrPortFrom(ip, 8080).String()
		}
	}
	var entries []proxy.AffinityEntry
	w.in(func() (err error) { entries, err = b.ListAffinity(context.Background(), st); return err })
	if len(entries) != 1 {
		t.Fatalf("affinity entries %+v, want one, of %s to %s (%s)", entries, client, answered, name)
	}
	e := entries[0]
	if e.ServicePort != web || e.Client != client || e.Endpoint.String() != answered || e.Frontend.String() != "10.96.0.10:80" ||
		e.Expires <= 55*time.Minute || e.Expires > time.Hour {
		t.Errorf("entry %+v, want %s pinned to %s (%s, which answered) through 10.96.0.10:80 for about an hour", e, client, answered, name)
	}
}
