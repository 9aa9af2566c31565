package server

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"k8s.io/utils/clock"
)

// Runner runs a function (the sync) with bounded frequency, like upstream
// kube-proxy's BoundedFrequencyRunner:
//
//   - Trigger asks for a run; any number of Triggers before the run starts
//     coalesce into that one run;
//   - two runs are never closer than minInterval, counted from the end of one
//     run to the start of the next (a sync that takes long still leaves the
//     kernel and the API some room);
//   - a run happens at least every maxInterval even with no Trigger (the
//     periodic resync);
//   - a failed run is retried after a backoff that starts at minInterval (at
//     least one second) and doubles up to maxInterval; a Trigger still runs
//     sooner, because new input may be what fixes the failure. A successful
//     run resets the backoff.
//
// The first run happens as soon as Run starts.
type Runner struct {
	name        string
	fn          func(context.Context) error
	minInterval time.Duration
	maxInterval time.Duration
	clk         clock.WithTicker
	log         *slog.Logger

	trigger chan struct{}
}

// NewRunner returns a Runner for fn. It panics when maxInterval is not
// positive or is less than minInterval: that is a programming error, and
// Config is validated before it gets here.
func NewRunner(name string, fn func(context.Context) error, minInterval, maxInterval time.Duration, clk clock.WithTicker) *Runner {
	if maxInterval <= 0 || maxInterval < minInterval || minInterval < 0 {
		panic(fmt.Sprintf("runner %s: need 0 <= minInterval (%s) <= maxInterval (%s) and maxInterval > 0", name, minInterval, maxInterval))
	}
	return &Runner{
		name:        name,
		fn:          fn,
		minInterval: minInterval,
		maxInterval: maxInterval,
		clk:         clk,
		log:         slog.New(slog.DiscardHandler),
		trigger:     make(chan struct{}, 1),
	}
}

// WithLogger makes the runner log failed runs and their retry delay.
func (r *Runner) WithLogger(log *slog.Logger) *Runner {
	r.log = log
	return r
}

// Trigger asks for a run as soon as minInterval allows. It never blocks.
func (r *Runner) Trigger() {
	select {
	case r.trigger <- struct{}{}:
	default:
	}
}

// Run calls fn as described on Runner until ctx is done. A run in progress
// when ctx is cancelled is not interrupted by the runner (fn gets ctx).
func (r *Runner) Run(ctx context.Context) {
	var (
		lastEnd time.Time     // end of the last run; zero before the first
		pending = true        // a Trigger (or the start) asked for a run
		retryAt time.Time     // when a failed run is retried; zero when none
		backoff time.Duration // the delay of the last retry
	)
	for {
		next := r.nextRun(lastEnd, pending, retryAt)
		if wait := next.Sub(r.clk.Now()); wait > 0 {
			timer := r.clk.NewTimer(wait)
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case <-r.trigger:
				timer.Stop()
				pending = true
				continue
			case <-timer.C():
			}
		}
		if ctx.Err() != nil {
			return
		}
		// Whatever was triggered until now is covered by this run.
		select {
		case <-r.trigger:
		default:
		}
		pending = false
		err := r.fn(ctx)
		lastEnd = r.clk.Now()
		if err == nil {
			retryAt, backoff = time.Time{}, 0
			continue
		}
		backoff = r.nextBackoff(backoff)
		retryAt = lastEnd.Add(backoff)
		r.log.Error("run failed; retrying", "runner", r.name, "retryIn", backoff, "error", err)
	}
}

// nextRun is the earliest time the next run may start.
func (r *Runner) nextRun(lastEnd time.Time, pending bool, retryAt time.Time) time.Time {
	if lastEnd.IsZero() {
		return lastEnd // the first run starts at once
	}
	next := lastEnd.Add(r.maxInterval)
	if !retryAt.IsZero() && retryAt.Before(next) {
		next = retryAt
	}
	if pending {
		next = lastEnd.Add(r.minInterval)
	}
	return next
}

func (r *Runner) nextBackoff(last time.Duration) time.Duration {
	d := 2 * last
	if last == 0 {
		d = max(r.minInterval, time.Second)
	}
	return min(d, r.maxInterval)
}
