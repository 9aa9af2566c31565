package proxy

import (
	"testing"

	v1 "k8s.io/api/core/v1"
)

func TestProtocolNumbersRoundTrip(t *testing.T) {
	for p, n := range map[v1.Protocol]uint8{v1.ProtocolTCP: 6, v1.ProtocolUDP: 17, v1.ProtocolSCTP: 132} {
		if got := ProtocolNumber(p); got != n {
			t.Errorf("ProtocolNumber(%s) = %d, want %d", p, got, n)
		}
		if got := ProtocolOf(n); got != p {
			t.Errorf("ProtocolOf(%d) = %q, want %s", n, got, p)
		}
	}
	if got := ProtocolNumber(""); got != 6 {
		t.Errorf("the default protocol is TCP: got %d", got)
	}
	if got := ProtocolOf(1); got != "" {
		t.Errorf("ICMP is no Service protocol: got %q", got)
	}
}
