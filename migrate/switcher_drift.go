package migrate

import (
	"context"

	"github.com/kpproxy/kp/proxy"
)

// DetectDrift runs the drift detector of the backend running now
// (proxy.DriftDetector), and after a switch the new backend's: the old
// mode's detector stops with its mode, and what it reports after the
// switch (the removal of its own rules, which is no drift) is dropped. A
// mode without a detector (none) watches nothing until the next switch.
func (s *Switcher) DetectDrift(ctx context.Context, drifted func(proxy.Drift)) error {
	for {
		s.mu.Lock()
		cur, swapped := s.cur, s.swapped
		s.mu.Unlock()
		dctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		d, running := cur.(proxy.DriftDetector)
		if running {
			go func() {
				done <- d.DetectDrift(dctx, func(dr proxy.Drift) {
					if now, _ := s.Current(); now == cur {
						drifted(dr)
					}
				})
			}()
		}
		select {
		case <-ctx.Done():
		case <-swapped:
		case err := <-done:
			running = false
			if err != nil {
				s.cfg.Log.Warn("drift detection stopped until the next switch of mode", "mode", cur.Mode(), "err", err)
			}
			select {
			case <-ctx.Done():
			case <-swapped:
			}
		}
		stop()
		if running {
			<-done
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}
