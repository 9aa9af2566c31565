package migrate

import (
	"slices"
	"testing"

	"github.com/kpproxy/kp/legacy/iptables"
	"github.com/kpproxy/kp/proxy"
)

// kp's chains in one iptables flavor belong to the mode that writes them:
// the ipvs mode's KP-IPVS- chains are the ipvs mode's, the userspace
// mode's KP-USERSPACE- redirects the userspace mode's, the rest the
// iptables mode's. A switch to ipvs (whose chains are in iptables) then
// finds nothing stale, and its plan keeps them.
func TestInventoryTellsKpsModesApartInOneIPTablesFlavor(t *testing.T) {
	dumps := parse(t, `*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KP-IPVS-SERVICES - [0:0]
:KP-IPVS-MARK-MASQ - [0:0]
:KP-USERSPACE-PORTALS - [0:0]
:KP-SERVICES - [0:0]
-A PREROUTING -m comment --comment "kp ipvs service portals" -j KP-IPVS-SERVICES
-A OUTPUT -m comment --comment "kp ipvs service portals" -j KP-IPVS-SERVICES
-A PREROUTING -j KP-USERSPACE-PORTALS
-A KP-IPVS-SERVICES -j KP-IPVS-MARK-MASQ
-A KP-USERSPACE-PORTALS -d 10.96.0.10/32 -p tcp --dport 80 -j REDIRECT --to-ports 40000
COMMIT
`)
	got := inventoryIPTables(dumps, iptables.FlavorLegacy, proxy.IPv4)
	want := []Found{
		{Owner: "kp", Mode: "iptables-legacy", Where: "iptables-legacy IPv4", Chains: 1},
		{Owner: "kp", Mode: "ipvs", Where: "iptables-legacy IPv4", Chains: 2, Rules: 3},
		{Owner: "kp", Mode: "userspace", Where: "iptables-legacy IPv4", Chains: 1, Rules: 2},
	}
	if !slices.Equal(got, want) {
		t.Errorf("inventory\n%+v\nwant\n%+v", got, want)
	}
	p := NewPlan(nil, proxy.Target{Mode: proxy.ModeIPVS}, proxy.Target{Mode: proxy.ModeIPVS}, got)
	if len(p.keep) != 1 || p.keep[0].Mode != "ipvs" || len(p.remove) != 2 {
		t.Errorf("a switch to ipvs keeps %+v and removes %+v; want the ipvs mode's chains kept, the rest removed", p.keep, p.remove)
	}
}
