package iptables

import (
	"flag"
	"fmt"
	"testing"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
)

// benchServices sizes the cold-start benchmark: -args -bench.services=10000.
var benchServices = flag.Int("bench.services", 1000, "Services (of 10 endpoints) in the cold-start benchmark")

// BenchmarkColdStartKernel is a cold start of -bench.services ClusterIP
// Services × 10 endpoints into iptables-nft in a fresh namespace, staged
// (kp's default) and in one restore, with the largest iptables-restore
// child's peak RSS (getrusage of the children, which the benchmark
// process has none other of).
func BenchmarkColdStartKernel(b *testing.B) {
	w := newWorld()
	for i := range *benchServices {
		var eps []string
		for j := range 10 {
			eps = append(eps, fmt.Sprintf("10.%d.%d.%d:8080", 100+i/250, i%250, j+1))
		}
		w.AddService(statetest.PortName("ns", fmt.Sprintf("svc%d", i), "p", v1.ProtocolTCP), fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), 80, 0, eps...)
	}
	st := w.Next()
	for _, staging := range []int{stageMaxChains, 0} {
		b.Run(fmt.Sprintf("staging=%d", staging), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				ns := testNamespace(b)
				be, err := New(testConfig(), nil, WithFlavor(FlavorNFT), WithStaging(staging),
					WithRunners(NewRunner(FlavorNFT, proxy.IPv4), NewRunner(FlavorNFT, proxy.IPv6)))
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				inNS(b, ns, func() error { return be.Sync(b.Context(), st) })
			}
			var ru unix.Rusage
			if err := unix.Getrusage(unix.RUSAGE_CHILDREN, &ru); err == nil {
				b.ReportMetric(float64(ru.Maxrss)/1024, "child-maxrss-MiB")
			}
		})
	}
}
