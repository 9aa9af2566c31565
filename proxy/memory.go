package proxy

import (
	"os"
	"runtime/debug"
)

// FullSyncGCPercent is GOGC while kp builds a whole ruleset: from its start
// (the initial lists) to the end of its first sync, and in every full sync.
// Those make garbage many times what kp keeps, and with the runtime's
// default (100) the heap grows to twice everything kp holds before a
// collection: at 10,000 Services × 10 that was kp's peak.
const FullSyncGCPercent = 25

// LowerGC sets GOGC to percent for a phase that makes much garbage, unless
// the operator chose GOGC; restore puts back what was there.
func LowerGC(percent int) (restore func()) {
	if os.Getenv("GOGC") != "" {
		return func() {}
	}
	prev := debug.SetGCPercent(percent)
	return func() { debug.SetGCPercent(prev) }
}
