package migrate

import (
	"fmt"

	"github.com/kpproxy/kp/proxy/statusapi"
)

// The Switcher's progress records: one statusapi.Migration per request,
// updated step by step under s.mu and served by the status API.

// Migration returns the progress of the last switch asked for (nil when
// none was).
func (s *Switcher) Migration() *statusapi.Migration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.progress == nil {
		return nil
	}
	m := *s.progress
	m.Steps = append([]statusapi.MigrationStep(nil), m.Steps...)
	if m.Verification != nil {
		v := *m.Verification
		m.Verification = &v
	}
	return &m
}

// begin marks req's progress record running and returns it; a step
// updates the record it began with, even if a newer request has replaced
// it as the one the status API shows.
func (s *Switcher) begin(req *switchRequest) *statusapi.Migration {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := req.progress
	p.From = s.curTarget.String()
	p.Phase = statusapi.MigrationRunning
	p.Started = s.cfg.Clock.Now()
	return p
}

func (s *Switcher) running(p *statusapi.Migration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return p.Phase == statusapi.MigrationRunning
}

// step records the start of a step; the returned func records its end.
func (s *Switcher) step(p *statusapi.Migration, name string) func(detail string, err error) {
	s.mu.Lock()
	p.Steps = append(p.Steps, statusapi.MigrationStep{Name: name, Started: s.cfg.Clock.Now()})
	i := len(p.Steps) - 1
	s.mu.Unlock()
	return func(detail string, err error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		st := &p.Steps[i]
		st.Ended, st.Detail = s.cfg.Clock.Now(), detail
		if err != nil {
			st.Error = err.Error()
		}
	}
}

func (s *Switcher) finish(p *statusapi.Migration, err error) {
	s.mu.Lock()
	p.Ended = s.cfg.Clock.Now()
	p.KeptForConnections = s.kept
	p.Phase = statusapi.MigrationSucceeded
	if err != nil {
		p.Phase, p.Error = statusapi.MigrationFailed, err.Error()
	}
	m := *p
	m.Steps = append([]statusapi.MigrationStep(nil), p.Steps...)
	s.mu.Unlock()
	if err != nil {
		s.cfg.Log.Error("migration failed", "id", m.ID, "from", m.From, "to", m.To, "err", err)
	} else {
		s.cfg.Log.Info("migration finished", "id", m.ID, "from", m.From, "to", m.To, "duration", m.Ended.Sub(m.Started))
	}
	if s.cfg.Finished != nil {
		s.cfg.Finished(m)
	}
}

// underWay is the error for a request while the switch asked last has not
// ended: it names that one, so the operator can follow or wait for it;
// s.mu is held. (A second request would replace the first's progress
// record while the first still runs, and its caller would lose track of
// it.)
func (s *Switcher) underWay() error {
	p := s.progress
	if p == nil || (p.Phase != statusapi.MigrationPending && p.Phase != statusapi.MigrationRunning) {
		return nil
	}
	return fmt.Errorf("switch %d to %s (asked by %s) is %s: wait for it to end, or follow it with kp migrate node --to %s",
		p.ID, p.To, p.RequestedBy, p.Phase, p.To)
}
