package ipvs

import (
	"context"
	"net/netip"
	"testing"

	"github.com/moby/ipvs"
	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy/statetest"
)

// TestDriftCheckFindsWhatOthersChangedInIPVS: on an in-memory kernel, a
// check after kp's sync finds nothing; a deleted virtual server (ipvsadm
// -D), a deleted or reweighted real server, a virtual server added on a
// Service address, a Service address deleted from kp-ipvs0 are each found
// once, and the sync after each (full) puts back what kp wrote.
func TestDriftCheckFindsWhatOthersChangedInIPVS(t *testing.T) {
	r := newIPVSRenderer(t).(ipvsRenderer)
	b, k := r.b, r.k
	w := statetest.New(statetest.Node("node-1", "192.168.0.10"))
	w.AddService(statetest.PortName("demo", "web", "http", v1.ProtocolTCP), "10.96.0.10", 80, 0, "10.244.1.2:8080", "10.244.1.3:8080")
	st := w.Next()
	if err := b.Sync(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	check := func() string {
		t.Helper()
		d, err := b.checkDrift(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if d == nil {
			return ""
		}
		return d.What
	}
	if d := check(); d != "" {
		t.Fatalf("right after kp's sync: %q", d)
	}
	web := vsKey{Proto: v1.ProtocolTCP, Addr: netip.MustParseAddr("10.96.0.10"), Port: 80}
	ep := netip.MustParseAddrPort("10.244.1.2:8080")
	synced := k.dump()
	for _, tc := range []struct {
		name   string
		tamper func()
		want   string
	}{
		{"ipvsadm -D", func() { delete(k.services, web); delete(k.dests, web) },
			"IPVS: virtual server tcp/10.96.0.10:80: deleted"},
		{"ipvsadm -d", func() { delete(k.dests[web], ep) },
			"IPVS: virtual server tcp/10.96.0.10:80: real server 10.244.1.2:8080 deleted"},
		{"ipvsadm -e -w 5", func() { k.dests[web][ep] = 5 },
			"IPVS: virtual server tcp/10.96.0.10:80: real server 10.244.1.2:8080 at weight 5, kp wrote 1"},
		{"ipvsadm -a of another real server", func() { k.dests[web][netip.MustParseAddrPort("10.244.9.9:80")] = 1 },
			"IPVS: virtual server tcp/10.96.0.10:80: real server 10.244.9.9:80 added"},
		{"ipvsadm -A on a Service address", func() {
			other := vsKey{Proto: v1.ProtocolUDP, Addr: web.Addr, Port: 53}
			k.services[other] = &ipvs.Service{}
			*k.services[other] = *keyService(other)
			k.dests[other] = map[netip.AddrPort]int{}
		}, "IPVS: virtual server udp/10.96.0.10:53: added on a Service address"},
		{"ip addr del", func() { delete(k.addrs, web.Addr) }, "IPVS: kp-ipvs0: address 10.96.0.10 deleted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.tamper()
			if d := check(); d != tc.want {
				t.Errorf("drift %q, want %q", d, tc.want)
			}
			if d := check(); d != "" {
				t.Errorf("reported again before the repair: %q", d)
			}
			if err := b.Sync(context.Background(), st); err != nil {
				t.Fatal(err)
			}
			if !b.LastSyncFull() {
				t.Error("the sync after a drift was not full")
			}
			if got := k.dump(); got != synced {
				t.Errorf("after the repair:\n%s\nwant:\n%s", got, synced)
			}
			if d := check(); d != "" {
				t.Errorf("after the repair: %q", d)
			}
		})
	}
}
