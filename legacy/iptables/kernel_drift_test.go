package iptables

import (
	"context"
	"strings"
	"testing"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/test/netns"
)

// TestKernelDriftCheckFindsAFlushedChainInEitherFlavor: in a namespace,
// with the kernel's Stamps: nothing after kp's sync; another program's
// chain is not kp's business; iptables -t nat -F KP-SERVICES (with the
// flavor's own binary) is found, and the sync after it puts the rules back.
func TestKernelDriftCheckFindsAFlushedChainInEitherFlavor(t *testing.T) {
	for _, fl := range []Flavor{FlavorNFT, FlavorLegacy} {
		t.Run(string(fl), func(t *testing.T) {
			ns := testNamespace(t)
			b := kernelBackend(t, fl, newClock(), WithRunners(NewRunner(fl, proxy.IPv4), NewRunner(fl, proxy.IPv6)))
			st := kernelWorld().Next()
			syncIn(t, ns, b, st)
			check := func() *proxy.Drift {
				t.Helper()
				var d *proxy.Drift
				inNS(t, ns, func() error {
					var err error
					d, err = b.checkDrift(context.Background())
					return err
				})
				return d
			}
			run := func(cmd ...string) {
				t.Helper()
				if out, err := netns.Exec(ns, cmd...); err != nil {
					t.Fatalf("%s: %v\n%s", strings.Join(cmd, " "), err, out)
				}
			}
			if d := check(); d != nil {
				t.Fatalf("right after kp's sync: %+v", d)
			}
			var stamp Stamp
			inNS(t, ns, func() error {
				r := NewStampReader(fl, proxy.IPv4)
				defer r.Close()
				var err error
				stamp, err = r.Read()
				return err
			})
			if stamp == (Stamp{}) {
				t.Errorf("the kernel's stamp reads as zero")
			}
			run("iptables-"+string(fl), "-t", "nat", "-N", "OTHER-PROGRAM")
			if d := check(); d != nil {
				t.Fatalf("after another program's chain: %+v", d)
			}
			ff := flavorFamily{fl, proxy.IPv4}
			before := strings.Count(saveIn(t, ns, ff, TableNAT), "-A KP-SERVICES ")
			run("iptables-"+string(fl), "-t", "nat", "-F", "KP-SERVICES")
			d := check()
			if d == nil || !strings.Contains(d.What, "nat KP-SERVICES: 0 rules, kp wrote") {
				t.Fatalf("after iptables -t nat -F KP-SERVICES: %+v", d)
			}
			t.Logf("drift: %s", d.What)
			syncIn(t, ns, b, st)
			if after := strings.Count(saveIn(t, ns, ff, TableNAT), "-A KP-SERVICES "); after != before || before == 0 {
				t.Errorf("KP-SERVICES has %d rules after the repair, %d before the flush", after, before)
			}
			if d := check(); d != nil {
				t.Errorf("after the repair: %+v", d)
			}
		})
	}
}
