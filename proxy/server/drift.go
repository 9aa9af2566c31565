package server

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/kpproxy/kp/proxy"
)

// driftRepairs follows the changes other processes made to kp's rules
// (proxy.DriftDetector) from their report to the sync that repairs them:
// a report triggers a sync at once, and that sync, once it succeeds,
// counts the repair (kp_rules_drift_repairs_total) and logs it.
type driftRepairs struct {
	log     *slog.Logger
	metrics *Metrics
	clk     clock.PassiveClock

	mu sync.Mutex
	// pending are the drifts reported since the last sync started, and
	// since when; a sync takes them (take) and gives them back when it
	// fails.
	pending []proxy.Drift
	since   time.Time
}

// watch runs d's detector until ctx ends, triggering a sync for each
// drift it reports.
func (r *driftRepairs) watch(ctx context.Context, d proxy.DriftDetector, mode func() proxy.Mode, trigger func()) {
	err := d.DetectDrift(ctx, func(dr proxy.Drift) {
		if dr.Unsure {
			r.log.Info("kp may have missed a change to its rules; the next sync reads them again",
				"mode", mode(), "reason", dr.What)
		} else {
			r.log.Warn("kp's rules were changed by another process; the next sync repairs them",
				"mode", mode(), "change", dr.What, "by", by(dr))
		}
		r.mu.Lock()
		if len(r.pending) == 0 {
			r.since = r.clk.Now()
		}
		r.pending = append(r.pending, dr)
		r.mu.Unlock()
		trigger()
	})
	if err != nil && ctx.Err() == nil {
		r.log.Warn("drift detection stopped: changes other processes make to kp's rules are repaired at the "+
			"periodic resync only", "mode", mode(), "err", err)
	}
}

func by(d proxy.Drift) string {
	if d.By == "" {
		return "unknown (the kernel does not say)"
	}
	return d.By
}

// take hands the pending drifts to the sync that starts now.
func (r *driftRepairs) take() ([]proxy.Drift, time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, since := r.pending, r.since
	r.pending = nil
	return p, since
}

// failed gives back the drifts of a sync that failed: the next sync
// repairs them.
func (r *driftRepairs) failed(drifts []proxy.Drift, since time.Time) {
	if len(drifts) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pending = append(drifts, r.pending...)
	r.since = since
}

// synced counts and logs the repair of drifts by the sync of mode that
// ended at end.
func (r *driftRepairs) synced(drifts []proxy.Drift, since, end time.Time, mode proxy.Mode) {
	known := 0
	for _, d := range drifts {
		if !d.Unsure {
			known++
		}
	}
	if known == 0 {
		return
	}
	r.metrics.DriftRepaired(mode)
	r.log.Info("repaired kp's rules", "mode", mode, "changes", known, "after", end.Sub(since))
}
