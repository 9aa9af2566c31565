// Package gctune lowers the garbage collector's target (GOGC) for the
// phases of kp that make much more garbage than kp keeps: the initial
// lists and a full sync. The figures behind each value are in
// test/bench/NOTES.md (GOGC 25 during full syncs; GOGC 50 while the
// initial lists arrive).
package gctune

import (
	"os"
	"runtime/debug"
)

// FullSync is GOGC while a backend makes a full sync: its garbage is many
// times what kp keeps, so at the default (100) the heap would grow to
// twice everything kp holds; lower costs the sync's CPU.
const FullSync = 25

// InitialLists is GOGC from kp's start to its first sync, while the
// initial lists are decoded and compacted: it keeps the process's peak
// under the full sync's.
const InitialLists = 50

// Lower sets GOGC to percent for a phase that makes much garbage, unless
// the operator chose GOGC; restore puts back what was there.
func Lower(percent int) (restore func()) {
	if os.Getenv("GOGC") != "" {
		return func() {}
	}
	prev := debug.SetGCPercent(percent)
	return func() { debug.SetGCPercent(prev) }
}
