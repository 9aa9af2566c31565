package migrate

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/kpproxy/kp/proxy"
)

// retireRetry is how often the state an old mode left for its established
// connections (IPVS virtual servers) is looked at again.
const retireRetry = 10 * time.Second

// retire runs Retire for the running target t. Within the drain bound
// after the last change of mode, the old mode's state that still carries
// connections (an IPVS virtual server with established connections or
// live UDP flows: conntrack does not carry them over) stays; syncs after
// it run Retire again (retireKept) until nothing is kept or the bound has
// passed.
func (s *Switcher) retire(ctx context.Context, t proxy.Target, st *proxy.State) error {
	now := s.cfg.Clock.Now()
	s.mu.Lock()
	keep := now.Before(s.keepUntil)
	s.mu.Unlock()
	kept, err := s.cfg.Retire(ctx, t, st, keep)
	s.mu.Lock()
	s.kept, s.nextRetire = kept, now.Add(retireRetry)
	trigger := s.trigger
	s.mu.Unlock()
	if kept > 0 {
		s.cfg.Log.Info("old mode's virtual servers kept while their connections last", "count", kept,
			"until", s.keepUntilTime().Format(time.RFC3339))
		if trigger != nil {
			time.AfterFunc(retireRetry, trigger)
		}
	}
	return err
}

// startDrain opens the drain bound at a change of mode (or at start).
func (s *Switcher) startDrain() {
	bound := s.cfg.Drain
	if bound <= 0 {
		bound = time.Hour
	}
	s.mu.Lock()
	s.keepUntil = s.cfg.Clock.Now().Add(bound)
	s.mu.Unlock()
}

func (s *Switcher) keepUntilTime() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.keepUntil
}

// retireKept runs Retire again when the last one kept state for
// connections and retireRetry has passed.
func (s *Switcher) retireKept(ctx context.Context, st *proxy.State) {
	s.mu.Lock()
	due := s.kept > 0 && !s.cfg.Clock.Now().Before(s.nextRetire)
	t := s.curTarget
	s.mu.Unlock()
	if !due {
		return
	}
	if err := s.retire(ctx, t, st); err != nil {
		s.cfg.Log.Warn("removing the old mode's drained state failed; retrying", "err", err)
	}
	if s.keptForConnections() == 0 {
		s.cfg.Log.Info("old mode's state removed: its connections have ended or the drain bound passed")
	}
}

// keptForConnectionsNote tells a migration's progress what the last Retire kept.
func (s *Switcher) keptForConnectionsNote() string {
	if n := s.keptForConnections(); n > 0 {
		return fmt.Sprintf("; %d IPVS virtual servers kept while their connections last", n)
	}
	return ""
}

func (s *Switcher) keptForConnections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.kept
}

// abandon removes a new backend's rules after its switch failed.
func (s *Switcher) abandon(ctx context.Context, b proxy.Backend, log *slog.Logger) {
	if err := b.Cleanup(ctx); err != nil {
		log.Error("migration: removing the new mode's rules failed", "err", err)
	}
	s.drain(b, log)
}

// drain lets an old backend that proxies connections itself (userspace)
// finish its open ones in the background.
func (s *Switcher) drain(b proxy.Backend, log *slog.Logger) {
	if d, ok := b.(proxy.Drainer); ok {
		d.RulesRemoved()
	}
	d, ok := b.(proxy.Shutdowner)
	if !ok {
		return
	}
	bound := s.cfg.Drain
	if bound <= 0 {
		bound = time.Hour
	}
	go func() {
		// Its UDP listeners keep answering the flows whose conntrack
		// entries still redirect to them until the conntrack cleaner,
		// which runs after this sync, has deleted those entries (their
		// next packets then take the new mode's path).
		time.Sleep(drainDelay)
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		defer cancel()
		if err := d.Shutdown(ctx); err != nil {
			log.Warn("old mode drained", "err", err)
		}
	}()
}

// drainDelay is how long an old userspace proxy keeps its listeners after
// its redirect rules are gone.
const drainDelay = 5 * time.Second
