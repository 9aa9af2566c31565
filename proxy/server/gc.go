package server

import (
	"os"
	"runtime/debug"
)

// FullSyncGCPercent is GOGC while a backend makes a full sync: its garbage
// is many times what kp keeps, and with the runtime's default (100) the
// heap grows to twice everything kp holds before a collection. Lower costs
// the sync's CPU: 12 took a 10,000-Service sync from 3.4 to 6.3 s for 6 MB
// less at its peak.
const FullSyncGCPercent = 25

// ListGCPercent is GOGC from kp's start to its first sync, while the
// initial lists arrive: each listed object is decoded whole and compacted,
// so the garbage is several times what the tracker keeps, and at the
// runtime's default the heap's high-water mark falls anywhere between the
// live heap and twice it, wherever the last doubling before the lists end
// lands (54 to 68 MB at 10,000 Services × 10 for ~30 MB live, measured with
// gctrace: the process's peak, above the full sync's ~55). At 50 it stays
// under the full sync's, and kp's peak RSS there went from 86–97 to 85–87
// MiB (4 cold starts each) for no visible cost in the cold start (2.6–2.8 s
// both); 25 had cost 0.7 s of a 4.6 s cold start.
const ListGCPercent = 50

// LowerGC sets GOGC to percent for a phase that makes much garbage, unless
// the operator chose GOGC; restore puts back what was there.
func LowerGC(percent int) (restore func()) {
	if os.Getenv("GOGC") != "" {
		return func() {}
	}
	prev := debug.SetGCPercent(percent)
	return func() { debug.SetGCPercent(prev) }
}
