package gctune

import (
	"runtime/debug"
	"testing"
)

// TestLowerLeavesAnOperatorsGOGC: Lower sets GOGC and restore puts it
// back, unless the operator set GOGC in the environment.
func TestLowerLeavesAnOperatorsGOGC(t *testing.T) {
	current := func() int {
		p := debug.SetGCPercent(100)
		debug.SetGCPercent(p)
		return p
	}
	for _, tc := range []struct {
		env  string
		want func(before int) int
	}{
		{"", func(int) int { return 25 }},
		{"200", func(before int) int { return before }},
	} {
		t.Run("GOGC="+tc.env, func(t *testing.T) {
			t.Setenv("GOGC", tc.env)
			before := current()
			restore := Lower(25)
			if got := current(); got != tc.want(before) {
				t.Errorf("GOGC while lowered: %d, want %d", got, tc.want(before))
			}
			restore()
			if got := current(); got != before {
				t.Errorf("GOGC after restore: %d, want %d", got, before)
			}
		})
	}
}
