package proxy

import (
	"os"
	"runtime/debug"
)

// FullSyncGCPercent is GOGC while a backend makes a full sync: its garbage
// is many times what kp keeps, and with the runtime's default (100) the
// heap grows to twice everything kp holds before a collection. Lower costs
// the sync's CPU: 12 took a 10,000-Service sync from 3.4 to 6.3 s for 6 MB
// less at its peak. From kp's start (the initial lists) it cost the cold
// start 0.7 s of 4.6 for 4 MB, so the lists go at the runtime's default.
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
