package iptables

import (
	"context"
	"fmt"
	"testing"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
)

// BenchmarkDriftCheckKernel is the iptables mode's drift check with
// -bench.services ClusterIP Services × 10 endpoints synced (IPv4) into a
// fresh namespace, per flavor: "unmoved" is every check while nobody
// writes to the tables (the Stamp as kp left it), "moved" one after
// another program wrote (iptables-save of nat and filter, compared with
// kp's books). child-cpu-ms is the iptables-save children's CPU per
// check. test/bench/NOTES.md, "Drift repair", records the runs.
func BenchmarkDriftCheckKernel(b *testing.B) {
	w := newWorld()
	for i := range *benchServices {
		var eps []string
		for j := range 10 {
			eps = append(eps, fmt.Sprintf("10.%d.%d.%d:8080", 100+i/250, i%250, j+1))
		}
		w.AddService(statetest.PortName("ns", fmt.Sprintf("svc%d", i), "p", v1.ProtocolTCP), fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), 80, 0, eps...)
	}
	st := w.Next()
	for _, fl := range []Flavor{FlavorNFT, FlavorLegacy} {
		b.Run(string(fl), func(b *testing.B) {
			ns := testNamespace(b)
			be := kernelBackend(b, fl, newClock(), WithRunners(NewRunner(fl, proxy.IPv4)))
			ctx := context.Background()
			inNS(b, ns, func() error { return be.Sync(ctx, st) })
			for _, moved := range []bool{false, true} {
				b.Run(map[bool]string{false: "unmoved", true: "moved"}[moved], func(b *testing.B) {
					var before, after unix.Rusage
					_ = unix.Getrusage(unix.RUSAGE_CHILDREN, &before)
					inNS(b, ns, func() error {
						for b.Loop() {
							if moved {
								be.drift.mu.Lock()
								clear(be.drift.stamps)
								be.drift.mu.Unlock()
							}
							if d, err := be.checkDrift(ctx); d != nil || err != nil {
								return fmt.Errorf("drift %v, %v", d, err)
							}
						}
						return nil
					})
					_ = unix.Getrusage(unix.RUSAGE_CHILDREN, &after)
					child := after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano()
					b.ReportMetric(float64(child)/1e6/float64(b.N), "child-cpu-ms/op")
				})
			}
		})
	}
}
