package iptables

import (
	"context"
	"fmt"
	"testing"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/test/netns"
)

// The kernel tests program throwaway network namespaces only, never the
// test machine's own firewall.

var allBinaries = []string{
	"iptables-nft-restore", "iptables-nft-save", "ip6tables-nft-restore", "ip6tables-nft-save",
	"iptables-legacy-restore", "iptables-legacy-save", "ip6tables-legacy-restore", "ip6tables-legacy-save",
}

// flavorFamily is one of the four backends a node can have.
type flavorFamily struct {
	Flavor Flavor
	Family proxy.Family
}

func (ff flavorFamily) String() string { return fmt.Sprintf("%s-%s", ff.Flavor, ff.Family) }

var allFlavorFamilies = []flavorFamily{
	{FlavorNFT, proxy.IPv4}, {FlavorNFT, proxy.IPv6}, {FlavorLegacy, proxy.IPv4}, {FlavorLegacy, proxy.IPv6},
}

// testNamespace is a new network namespace, deleted when t ends; it skips
// t unless it runs as root with both flavors' binaries.
func testNamespace(t testing.TB) string {
	t.Helper()
	netns.Require(t, allBinaries...)
	return netns.NewNamespace(t, "ipt")
}

// inNS runs fn in namespace ns, failing t on error.
func inNS(t testing.TB, ns string, fn func() error) {
	t.Helper()
	if err := netns.InNamespace(ns, fn); err != nil {
		t.Fatalf("in %s: %v", ns, err)
	}
}

// restoreIn feeds data to ff's iptables-restore in namespace ns.
func restoreIn(t *testing.T, ns string, ff flavorFamily, data string) {
	t.Helper()
	inNS(t, ns, func() error { return NewRunner(ff.Flavor, ff.Family).Restore(context.Background(), []byte(data)) })
}

// saveIn is ff's iptables-save of table in namespace ns.
func saveIn(t *testing.T, ns string, ff flavorFamily, table Table) string {
	t.Helper()
	var out []byte
	inNS(t, ns, func() error {
		var err error
		out, err = NewRunner(ff.Flavor, ff.Family).Save(context.Background(), table, false)
		return err
	})
	return string(out)
}
