package nft

import (
	"net/netip"
	"testing"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
	v1 "k8s.io/api/core/v1"
)

func TestEndpointCountersAreReportedPerServicePortAndEndpoint(t *testing.T) {
	fake := NewFake()
	b := newFakeBackend(t, fake)
	w := newWorld()
	web := statetest.PortName("demo", "web", "http", v1.ProtocolTCP)
	w.AddService(web, "10.96.0.10", 80, 0, "10.244.1.2:8080", "10.244.1.3:8080")
	w.AddService(statetest.PortName("demo", "empty", "", v1.ProtocolTCP), "10.96.0.11", 80, 0)
	st := w.Next()
	mustSync(t, b, st)
	var _ proxy.CounterReporter = b
	got, err := b.EndpointCounters(st)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []string{"10.244.1.2:8080", "10.244.1.3:8080"} {
		if _, ok := got[proxy.EndpointRef{ServicePort: web, Endpoint: netip.MustParseAddrPort(e)}]; !ok {
			t.Errorf("no counter for %s %s in %v", web, e, got)
		}
	}
	if len(got) != 2 {
		t.Errorf("%d counters, want 2 (a Service without endpoints has none): %v", len(got), got)
	}
}
