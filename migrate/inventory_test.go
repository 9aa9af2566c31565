package migrate

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/kpproxy/kp/legacy/iptables"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/test/netns"
)

// kp's iptables chains are counted for the mode that writes them: the
// userspace mode's redirects and the ipvs mode's chains are not the
// iptables mode's (a switch into userspace with iptables redirects was
// reported as leaving "kp iptables-legacy" behind).
func TestInventoryCountsKpsIPTablesChainsByTheirMode(t *testing.T) {
	dumps := parse(t, `*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KP-USERSPACE-PORTALS - [0:0]
:KP-SERVICES - [0:0]
-A PREROUTING -j KP-USERSPACE-PORTALS
-A OUTPUT -j KP-USERSPACE-PORTALS
-A OUTPUT -j KP-SERVICES
-A KP-USERSPACE-PORTALS -d 10.96.0.10/32 -p tcp --dport 80 -j REDIRECT --to-ports 40001
COMMIT
*filter
:INPUT ACCEPT [0:0]
:KP-IPVS-FILTER - [0:0]
-A INPUT -j KP-IPVS-FILTER
COMMIT
`)
	got := fmt.Sprint(inventoryIPTables(dumps, iptables.FlavorLegacy, proxy.IPv4))
	want := "[{kp iptables-legacy iptables-legacy IPv4 1 1 0 0} {kp ipvs iptables-legacy IPv4 1 1 0 0} {kp userspace iptables-legacy IPv4 1 3 0 0}]"
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

// kp in the nftables mode without NET_RAW (the DaemonSet's proxy container
// with the capability removed) on a node whose kernel holds no
// iptables-legacy table: the inventory, the search for kube-proxy's rules
// and the take-over read every flavor without error (nothing is in
// legacy iptables, and kp knows it from /proc/net/ip_tables_names and
// ip6_tables_names, which need no capability), run no legacy binary, and
// leave no legacy table behind; kube-proxy's rules in iptables-nft are
// found and removed as with the capability.
func TestKernelNoLegacyTableNeedsNoNetRaw(t *testing.T) {
	netns.Require(t, "iptables-nft-restore", "iptables-legacy-save", "ip6tables-legacy-save")
	ctx := context.Background()
	ns := netns.NewNamespace(t, "mgc")
	if err := netns.InNamespace(ns, func() error {
		return iptables.NewRunner(iptables.FlavorNFT, proxy.IPv4).Restore(ctx, []byte(readFixture(t, "kube-proxy-iptables-nat.rules")))
	}); err != nil {
		t.Fatal(err)
	}
	calls := netns.WithoutCapability(t, "net_raw", "iptables-legacy", "ip6tables-legacy", "iptables-legacy-save",
		"ip6tables-legacy-save", "iptables-legacy-restore", "ip6tables-legacy-restore")
	var found []Found
	var invErr, findErr, takeErr, afterErr error
	var after []Found
	var tables []string
	_ = netns.InNamespace(ns, func() error {
		found, invErr = Inventory(ctx)
		_, findErr = KubeProxyIPTables(ctx, false)
		to := &TakeOver{Mode: proxy.ModeNFTables, Log: slog.New(slog.DiscardHandler)}
		_, takeErr = to.Run(ctx)
		after, afterErr = Inventory(ctx)
		for _, f := range []proxy.Family{proxy.IPv4, proxy.IPv6} {
			names, _ := iptables.LegacyTables(f)
			tables = append(tables, names...)
		}
		return nil
	})
	for what, err := range map[string]error{"Inventory": invErr, "KubeProxyIPTables": findErr, "TakeOver.Run": takeErr, "Inventory after": afterErr} {
		if err != nil {
			t.Errorf("%s without NET_RAW: %v", what, err)
		}
	}
	if !slices.ContainsFunc(found, func(f Found) bool { return f.Owner == "kube-proxy" && f.Where == "iptables-nft IPv4" }) {
		t.Errorf("inventory %v lacks kube-proxy's rules in iptables-nft", found)
	}
	if slices.ContainsFunc(after, func(f Found) bool { return f.Owner == "kube-proxy" }) {
		t.Errorf("after the take-over, inventory %v still lists kube-proxy's rules", after)
	}
	if c := calls(); len(c) > 0 {
		t.Errorf("ran %q; want no legacy binary run where the kernel holds no legacy table", c)
	}
	if len(tables) > 0 {
		t.Errorf("the kernel holds legacy tables %q after kp's reads; want none", tables)
	}
}

// A node whose iptables-legacy holds kube-proxy's rules, read by a kp
// without NET_RAW (the DaemonSet's proxy container before it had it): the
// inventory and the take-over's finder fail naming the cause, and the
// take-over reports it, rather than finding nothing and leaving the rules.
// With the capability, the same rules are listed and removed.
func TestKernelUnreadableLegacyIsAnErrorNotAnEmptyInventory(t *testing.T) {
	netns.Require(t, "iptables-legacy-restore", "iptables-legacy-save", "ip6tables-legacy-save")
	ctx := context.Background()
	ns := netns.NewNamespace(t, "mgc")
	r := iptables.NewRunner(iptables.FlavorLegacy, proxy.IPv4)
	if err := netns.InNamespace(ns, func() error {
		return r.Restore(ctx, []byte(readFixture(t, "kube-proxy-iptables-nat.rules")))
	}); err != nil {
		t.Fatal(err)
	}
	t.Run("without NET_RAW", func(t *testing.T) {
		netns.WithoutCapability(t, "net_raw", "iptables-legacy-save", "ip6tables-legacy-save")
		var invErr, findErr, takeErr error
		_ = netns.InNamespace(ns, func() error {
			_, invErr = Inventory(ctx)
			_, findErr = KubeProxyIPTables(ctx, true)
			to := &TakeOver{Mode: proxy.ModeNFTables, Log: slog.New(slog.DiscardHandler)}
			_, takeErr = to.Run(ctx)
			return nil
		})
		for what, err := range map[string]error{"Inventory": invErr, "KubeProxyIPTables": findErr, "TakeOver.Run": takeErr} {
			t.Logf("%s: %v", what, err)
			if err == nil || !strings.Contains(err.Error(), "iptables-legacy-save") || !strings.Contains(err.Error(), "Permission denied") ||
				!strings.Contains(err.Error(), "CAP_NET_RAW") || !strings.Contains(err.Error(), "(nat in /proc/net/ip_tables_names)") {
				t.Errorf("%s = %v; want an error naming iptables-legacy-save, the permission, CAP_NET_RAW and the legacy table", what, err)
			}
		}
	})
	var found []Found
	if err := netns.InNamespace(ns, func() (err error) { found, err = Inventory(ctx); return err }); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(found, func(f Found) bool { return f.Owner == "kube-proxy" && f.Where == "iptables-legacy IPv4" }) {
		t.Errorf("with NET_RAW: inventory %v lacks kube-proxy's legacy rules (removed while unreadable?)", found)
	}
}
