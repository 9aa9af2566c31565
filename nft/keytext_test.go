package nft

import (
	"net/netip"
	"testing"
)

// TestKeyTextOfSpellsKeysAsRendered: the elements kp deletes (known by their
// keys alone) print as the elements it wrote.
func TestKeyTextOfSpellsKeysAsRendered(t *testing.T) {
	r := &serviceRender{proto: 6, sp: scaleState(1, 1).Services[spName("ns", "svc0", "p")]}
	a4, a6 := netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("fd00::1")
	for _, e := range []struct {
		set string
		e   Element
	}{
		{mapServiceIPs, r.addrElement(a4)},
		{mapServiceIPs, r.addrElement(a6)},
		{mapEndpoints, r.slotElement(7, netip.MustParseAddrPort("10.244.0.1:80"))},
		{setHairpin, hairpinElement(a4)},
		{setHairpin, hairpinElement(a6)},
		{setClusterIPs, Element{Key: addrKey(a6), KeyText: a6.String()}},
	} {
		if got := keyTextOf(e.set, keyID(e.e.Key, e.e.KeyEnd)); got != e.e.KeyText {
			t.Errorf("%s: keyTextOf = %q, want %q", e.set, got, e.e.KeyText)
		}
	}
}
