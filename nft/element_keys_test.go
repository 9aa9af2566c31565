package nft

import (
	"net/netip"
	"testing"
	"unsafe"

	"github.com/kpproxy/kp/proxy/statetest"
	v1 "k8s.io/api/core/v1"
)

// TestKeyTextOfSpellsKeysAsRendered: the elements kp deletes (known by their
// keys alone) print as the elements it wrote.
func TestKeyTextOfSpellsKeysAsRendered(t *testing.T) {
	r := &serviceRender{proto: 6, sp: scaleState(1, 1).Services[statetest.PortName("ns", "svc0", "p", v1.ProtocolTCP)]}
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

// An Element stays small enough for a Go map to hold it inline: a larger
// value is allocated apart for every element put in a view.
func TestElementFitsInAMapSlot(t *testing.T) {
	if size := unsafe.Sizeof(Element{}); size > 128 {
		t.Errorf("Element is %d bytes; a map holds a value over 128 out of line", size)
	}
}
