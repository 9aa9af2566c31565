package userspace

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"testing"

	vnetns "github.com/vishvananda/netns"
	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/legacy/iptables"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/test/netns"
)

var benchServices = flag.Int("bench.services", 1000, "Services of BenchmarkDriftCheckKernel")

// BenchmarkDriftCheckKernel is the userspace mode's drift check of
// -bench.services Services' redirects (IPv4), written into a fresh
// namespace by each redirect method: "unmoved" reads the stamp only (every
// check while nobody writes), "moved" reads the rules and compares them (a
// check after another program wrote). test/bench/NOTES.md, "Drift
// repair", records the runs.
func BenchmarkDriftCheckKernel(b *testing.B) {
	var rules Rules
	for i := range *benchServices {
		r := Redirect{Comment: fmt.Sprintf("ns/svc%d:p", i), Addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}),
			Protocol: v1.ProtocolTCP, Port: 80, ToPort: 20000 + i}
		rules.Redirects = append(rules.Redirects, r)
		rules.Listeners = append(rules.Listeners, Listener{Protocol: v1.ProtocolTCP, Port: r.ToPort, Comment: r.Comment})
	}
	for _, method := range []string{RedirectNFTables, "iptables-legacy"} {
		b.Run(method, func(b *testing.B) {
			ns := netns.NewNamespace(b, "usdrift")
			h, err := vnetns.GetFromName(ns)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { h.Close() })
			be, err := New(proxy.Config{}, nil, NamespaceOps(h))
			if err != nil {
				b.Fatal(err)
			}
			var red redirector = nftRedirector{ops: &be.ops, wrote: &nftWritten{}}
			if method != RedirectNFTables {
				red = &iptRedirector{cfg: be.cfg, log: be.log, ops: &be.ops, flavor: iptables.FlavorLegacy}
			}
			ctx := context.Background()
			if err := red.write(ctx, proxy.IPv4, rules); err != nil {
				b.Fatal(err)
			}
			b.Run("unmoved", func(b *testing.B) {
				for b.Loop() {
					if _, err := red.stamp(proxy.IPv4); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("moved", func(b *testing.B) {
				for b.Loop() {
					if diffs, err := red.drifted(ctx, proxy.IPv4, rules); len(diffs) > 0 || err != nil {
						b.Fatalf("drift %v, %v", diffs, err)
					}
				}
			})
		})
	}
}
