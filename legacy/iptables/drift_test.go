package iptables

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
)

// TestDriftCheckFindsWhatOthersChangedInKPsChainsOnly: a check after kp's
// sync finds nothing; a flushed KP-SERVICES, a deleted jump from a
// built-in chain, a deleted service chain are each found (once: the next
// Sync repairs them, and is full); another program's chains are not kp's
// business.
func TestDriftCheckFindsWhatOthersChangedInKPsChainsOnly(t *testing.T) {
	fk := NewFake(FlavorNFT, proxy.IPv4)
	b, err := New(testConfig(), nil, WithRunners(fk), WithClock(newClock().now), WithRouteLocalnet(func() error { return nil }),
		WithLocalAddrs(func() ([]netip.Addr, error) { return nil, nil }), WithStaging(0),
		WithStamps(func(Flavor, proxy.Family) (Stamp, error) { return Stamp{}, errors.New("no stamps in a fake") }))
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld()
	web := w.AddService(statetest.PortName("demo", "web", "http", v1.ProtocolTCP), "10.96.0.10", 80, 30080, "10.244.1.1:8080")
	st := w.Next()
	mustSync(t, b, st)
	ctx := context.Background()
	check := func() string {
		t.Helper()
		d, err := b.checkDrift(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if d == nil {
			return ""
		}
		return d.What
	}
	if d := check(); d != "" {
		t.Fatalf("right after kp's sync: drift %q", d)
	}
	nat := func() *FakeTable { return fk.Tables[TableNAT] } // a restore replaces it
	for _, tc := range []struct {
		name   string
		tamper func()
		want   string
	}{
		{"iptables -t nat -F KP-SERVICES", func() { delete(nat().Rules, chainServices) },
			"iptables-nft IPv4: nat KP-SERVICES: 0 rules, kp wrote "},
		{"the jump from PREROUTING deleted", func() {
			nat().Rules["PREROUTING"] = slices.DeleteFunc(nat().Rules["PREROUTING"], func(r string) bool { return strings.Contains(r, chainServices) })
		}, "nat PREROUTING: 0 jumps to KP-SERVICES, kp wrote 1"},
		{"a service chain deleted", func() {
			name, t := svcChainName(web), nat()
			delete(t.Rules, name)
			t.Chains = slices.DeleteFunc(t.Chains, func(c string) bool { return c == name })
			t.index = nil
		}, "nat " + svcChainName(web) + ": deleted"},
		{"a rule added to a service chain", func() {
			nat().Rules[svcChainName(web)] = append(nat().Rules[svcChainName(web)], "-j ACCEPT")
		}, "nat " + svcChainName(web) + ": 3 rules, kp wrote 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.tamper()
			if d := check(); !strings.Contains(d, tc.want) {
				t.Errorf("drift %q, want it to hold %q", d, tc.want)
			}
			if d := check(); d != "" {
				t.Errorf("reported again before the repair: %q", d)
			}
			mustSync(t, b, st)
			if !b.LastSyncFull() {
				t.Error("the sync after a drift was not full")
			}
			if d := check(); d != "" {
				t.Errorf("after the repair: drift %q", d)
			}
		})
	}
	// Another program's chains, and its rules in built-in chains.
	t2 := nat()
	t2.Chains = append(t2.Chains, "CNI-HOSTPORT-DNAT")
	t2.index = nil
	t2.Rules["CNI-HOSTPORT-DNAT"] = []string{"-p tcp --dport 8080 -j DNAT --to-destination 10.244.1.9:80"}
	t2.Rules["PREROUTING"] = append(t2.Rules["PREROUTING"], "-j CNI-HOSTPORT-DNAT")
	if d := check(); d != "" {
		t.Errorf("another program's chains: drift %q", d)
	}
}

// TestDriftCheckReadsNothingWhileTheStampHasNotMoved: with the Stamp as kp
// left it, a check does not read the tables; when it moved for another
// program's change, the check reads them once and takes the new Stamp.
func TestDriftCheckReadsNothingWhileTheStampHasNotMoved(t *testing.T) {
	fk := &savesCounted{Fake: NewFake(FlavorLegacy, proxy.IPv4)}
	gen := uint32(1)
	b, err := New(testConfig(), nil, WithRunners(fk), WithClock(newClock().now), WithRouteLocalnet(func() error { return nil }),
		WithLocalAddrs(func() ([]netip.Addr, error) { return nil, nil }), WithStaging(0),
		WithStamps(func(Flavor, proxy.Family) (Stamp, error) { return Stamp{gen: gen}, nil }))
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld()
	w.AddService(statetest.PortName("demo", "web", "http", v1.ProtocolTCP), "10.96.0.10", 80, 0, "10.244.1.1:8080")
	mustSync(t, b, w.Next())
	saves := fk.saves
	for range 3 {
		if d, err := b.checkDrift(context.Background()); d != nil || err != nil {
			t.Fatalf("drift %v, %v", d, err)
		}
	}
	if fk.saves != saves {
		t.Errorf("%d saves with the Stamp unmoved, want none", fk.saves-saves)
	}
	gen++ // another program wrote
	for range 3 {
		if d, err := b.checkDrift(context.Background()); d != nil || err != nil {
			t.Fatalf("drift %v, %v", d, err)
		}
	}
	if n := fk.saves - saves; n != 2 {
		t.Errorf("%d saves after the Stamp moved once, want 2 (nat and filter, once)", n)
	}
}

// savesCounted counts a Fake's saves.
type savesCounted struct {
	*Fake
	saves int
}

func (s *savesCounted) Save(ctx context.Context, table Table, counters bool) ([]byte, error) {
	s.saves++
	return s.Fake.Save(ctx, table, counters)
}
