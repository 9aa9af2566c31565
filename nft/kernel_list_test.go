package nft

import (
	"context"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
)

// Without the nft CLI (kp's image has none), or for another network
// namespace, ListRules reads kp's tables through netlink: every chain, and
// every rule with the handle `nft -a list table` gives it, so kp explain
// still names the rules a trace names.
func TestKernelListRulesThroughNetlinkHasNFTsHandles(t *testing.T) {
	ns, _, b := kernelBackend(t)
	w := newWorld()
	web := statetest.PortName("demo", "web", "http", v1.ProtocolTCP)
	w.AddService(web, "10.96.0.10", 80, 30080, "10.244.1.2:8080", "10.244.1.3:8080")
	mustSync(t, b, w.Next())

	listings, err := b.ListRules(context.Background()) // a backend of another namespace: through netlink
	if err != nil {
		t.Fatal(err)
	}
	if len(listings) != 2 || listings[0].Format != ListingFormatNetlink || listings[0].Where != "nftables ip kp" {
		t.Fatalf("listings %+v: want ip kp and ip6 kp, through netlink", listings)
	}
	if !strings.Contains(listings[0].Text, "ip daddr . meta l4proto . th dport vmap @service-ips # handle") {
		t.Errorf("the services chain's dispatch is not described as kp writes it:\n%s", listings[0].Text)
	}
	if testing.Verbose() {
		t.Logf("through netlink:\n%s", listings[0].Text)
	}
	viaNetlink := parseListing(listings[0], familyIPv4)
	viaNFT := parseListing(proxy.RuleListing{Format: "nft", Text: nftIn(t, ns, "-a", "list", "table", "ip", TableName)}, familyIPv4)
	if len(viaNFT) == 0 || len(viaNetlink) != len(viaNFT) {
		t.Fatalf("%d chains through netlink, %d listed by nft", len(viaNetlink), len(viaNFT))
	}
	handles := func(rs []listedRule) []uint64 {
		var hs []uint64
		for _, r := range rs {
			hs = append(hs, r.handle)
		}
		return hs
	}
	for chain, rules := range viaNFT {
		if got, want := handles(viaNetlink[chain]), handles(rules); !slices.Equal(got, want) {
			t.Errorf("chain %s: handles %v through netlink, %v by nft", chain, got, want)
		}
	}
}
