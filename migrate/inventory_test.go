package migrate

import (
	"fmt"
	"testing"

	"github.com/kpproxy/kp/legacy/iptables"
	"github.com/kpproxy/kp/proxy"
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
