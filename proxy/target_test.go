package proxy

import (
	"strings"
	"testing"
)

func TestQuoteBoundedCutsLongValuesOnARuneBoundary(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"iptables", `"iptables"`},
		{"nft\x00\n", `"nft\x00\n"`},
		{strings.Repeat("x", 64), `"` + strings.Repeat("x", 64) + `"`},
		{strings.Repeat("x", 63) + "é" + "tail", `"` + strings.Repeat("x", 63) + `"…`},
		{strings.Repeat("x", 70), `"` + strings.Repeat("x", 64) + `"…`},
		{strings.Repeat("\x80", 100), `"` + strings.Repeat(`\x80`, 61) + `"…`},
	} {
		if got := QuoteBounded(tc.in); got != tc.want {
			t.Errorf("QuoteBounded(%.20q…) = %s, want %s", tc.in, got, tc.want)
		}
	}
}
