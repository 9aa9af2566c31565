package conntrack

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
)

// The cleaner's cost per sync under churn at 10,000 Services × 10
// endpoints (issue 35: kp's CPU per change grew with N): a sync that
// changes one TCP Service's endpoints, over a conntrack table of
// established TCP connections only (nothing there can be stale), and with
// one UDP flow too (the judge is built). test/bench/NOTES.md has the
// figures.
func BenchmarkCleanAfterAnEndpointChange(b *testing.B) {
	const services = 10000
	w := statetest.New()
	names := make([]proxy.ServicePortName, services)
	for i := range services {
		names[i] = statetest.PortName("ns", fmt.Sprintf("svc-%d", i), "", "TCP")
		eps := make([]string, 10)
		for e := range eps {
			eps[e] = fmt.Sprintf("10.%d.%d.%d:8080", 100+i/65536, i/256%256, e+1) // unique per Service
		}
		w.AddService(names[i], fmt.Sprintf("10.96.%d.%d", i/256, i%256), 80, 0, eps...)
	}
	dns := statetest.PortName("kube-system", "dns", "", "UDP")
	w.AddService(dns, "10.95.0.10", 53, 0, "10.244.0.53:53")
	prev := w.Next()
	w.SetEndpoints(names[7], "10.200.0.1:8080", "10.200.0.2:8080")
	cur := w.Next()
	var established []Flow
	for i := range 200 {
		f := flow(ProtoTCP, fmt.Sprintf("10.244.9.9:%d", 30000+i), fmt.Sprintf("10.96.0.%d:80", i%256), "10.100.0.1:8080")
		f.ProtoState = tcpEstablished
		established = append(established, f)
	}
	udp := flow(ProtoUDP, "10.244.9.9:40000", "10.95.0.10:53", "10.244.0.53:53")
	for _, tc := range []struct {
		name  string
		flows []Flow
	}{{"established TCP only", established}, {"and one UDP flow", append(established[:len(established):len(established)], udp)}} {
		b.Run(tc.name, func(b *testing.B) {
			conn := &fakeConn{flows: tc.flows}
			c := NewCleaner(CleanerConfig{Dial: func() (Conn, error) { return conn, nil },
				LocalAddrs: func() ([]netip.Addr, error) { return nil, nil }})
			b.ReportAllocs()
			for b.Loop() {
				if n, err := c.Clean(context.Background(), prev, cur); err != nil || n != 0 {
					b.Fatalf("Clean = %d, %v", n, err)
				}
			}
		})
	}
}
