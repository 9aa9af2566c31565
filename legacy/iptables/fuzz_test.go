package iptables

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/test/fuzzsync"
)

// FuzzManifestToIPTables follows arbitrary manifest bytes through the
// folder source's decoder and the change tracker (fuzzsync.Check) into the
// iptables backend on two Fakes (IPv4 and IPv6), which apply
// iptables-restore input as the kernel does and refuse jumps to missing
// chains and deletes of absent rules. After every change (objects removed,
// put back, one Service deleted and re-added) the tables a backend wrote
// with partial syncs must equal those of a fresh backend after one full
// sync of the same State. Seeds: the demo's manifests, nft's
// testdata/manifests and the committed corpus
// (testdata/fuzz/FuzzManifestToIPTables).
func FuzzManifestToIPTables(f *testing.F) {
	fuzzsync.AddSeeds(f, "../../manifests/demo/*.yaml", "../../nft/testdata/manifests/*.yaml")
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzsync.Check(t, data, newIPTablesRenderer)
	})
}

type iptablesRenderer struct {
	b     *Backend
	fakes []*Fake
}

func newIPTablesRenderer(t *testing.T) fuzzsync.Renderer {
	fakes := []*Fake{NewFake(FlavorNFT, proxy.IPv4), NewFake(FlavorNFT, proxy.IPv6)}
	cfg := testConfig()
	cfg.ClusterCIDRs = append(cfg.ClusterCIDRs, netip.MustParsePrefix("fd00:10:244::/56"))
	// Staging off: a cold start staged in small restores ends as the
	// same tables (stage_test.go); here it would only slow the fuzzer.
	b, err := New(cfg, nil, WithRunners(fakes[0], fakes[1]), WithClock(newClock().now),
		WithRouteLocalnet(func() error { return nil }),
		WithLocalAddrs(func() ([]netip.Addr, error) { return nil, nil }), WithStaging(0))
	if err != nil {
		t.Fatal(err)
	}
	return iptablesRenderer{b: b, fakes: fakes}
}

func (r iptablesRenderer) Sync(st *proxy.State) error { return r.b.Sync(context.Background(), st) }

// Dump lists each family's tables, chains by name (the order chains were
// created in is history, not behaviour), each chain's rules in order.
func (r iptablesRenderer) Dump() string {
	var sb strings.Builder
	for _, fk := range r.fakes {
		for _, table := range []Table{TableNAT, TableFilter} {
			ft := fk.Tables[table]
			sb.WriteString(fk.Fam.String() + " *" + string(table) + "\n")
			for _, c := range slices.Sorted(slices.Values(ft.Chains)) {
				sb.WriteString(":" + c + "\n")
				for _, rule := range ft.Rules[c] {
					sb.WriteString("  " + rule + "\n")
				}
			}
		}
	}
	return sb.String()
}
