package proxy

import (
	"context"
	"log/slog"
	"time"
)

// Drift is a change to a mode's rules in the kernel that kp did not make:
// an nft or iptables command, a deleted IPVS virtual server, another
// program flushing a table. The backend's next Sync repairs it.
type Drift struct {
	// What says what changed, for the log: "ip kp: deleted 1 element of
	// map service-ips", "nat KP-SERVICES: 0 rules, kp wrote 4".
	What string
	// By names the process that made the change when the kernel says
	// (nftables does): "nft (pid 4242)"; "" when it does not.
	By string
	// Unsure: the detector cannot tell whether anything changed (the
	// kernel's notifications overflowed its socket), so the next Sync
	// reads the kernel again and repairs what differs; nothing is known
	// to have drifted, and no repair is counted for it.
	Unsure bool
}

// DefaultDriftCheckPeriod is how often the modes without change events
// (iptables, ipvs, userspace) compare their rules in the kernel with what
// kp wrote: a repair lands within about twice it.
const DefaultDriftCheckPeriod = 500 * time.Millisecond

// driftCheckShare bounds the time the checks take: the next one waits
// driftCheckShare times as long as the last took, when that is longer
// than the period, so a check that is slow on a large ruleset (at 10,000
// Services 2 s with iptables-legacy, 8 s with iptables-nft once another
// program wrote; test/bench/NOTES.md, "Drift repair") never takes more
// than a tenth of a core.
const driftCheckShare = 10

// DriftCheck compares a mode's rules in the kernel with what kp last wrote:
// nil when they match (or when there is nothing to compare yet), else what
// drifted. A check that finds a sync running skips its turn rather than
// wait for it: its duration paces the next one, and must be its own.
type DriftCheck func(ctx context.Context) (*Drift, error)

// PollDrift runs check every period until ctx ends, and tells drifted of
// each drift it finds: the DriftDetector of a mode that has no change
// events to listen to. A check that fails is logged (once per distinct
// error) and tried again at the next period. A check must not report the
// same drift again until the backend's next Sync took it.
func PollDrift(ctx context.Context, period time.Duration, check DriftCheck, drifted func(Drift), log *slog.Logger) error {
	if period <= 0 {
		return nil
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	timer := time.NewTimer(period)
	defer timer.Stop()
	lastErr := ""
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		start := time.Now()
		d, err := check(ctx)
		took := time.Since(start)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && err.Error() != lastErr:
			log.Warn("cannot compare kp's rules in the kernel with what kp wrote; trying again", "err", err)
			lastErr = err.Error()
		case err == nil:
			lastErr = ""
		}
		if d != nil {
			drifted(*d)
		}
		timer.Reset(max(period, driftCheckShare*took))
	}
}
