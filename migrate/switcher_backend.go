package migrate

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/kpproxy/kp/proxy"
)

// The Switcher as the Backend the sync loop runs: each call goes to the
// backend running now.

// Current returns the backend running now and its target.
func (s *Switcher) Current() (proxy.Backend, proxy.Target) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur, s.curTarget
}

// Mode is the current backend's mode.
func (s *Switcher) Mode() proxy.Mode { b, _ := s.Current(); return b.Mode() }

// Probe probes the current backend (kp probed it before starting).
func (s *Switcher) Probe(ctx context.Context) error { b, _ := s.Current(); return b.Probe(ctx) }

// Cleanup cleans the current backend.
func (s *Switcher) Cleanup(ctx context.Context) error { b, _ := s.Current(); return b.Cleanup(ctx) }

// EndpointCounters reads the current backend's counters.
func (s *Switcher) EndpointCounters(st *proxy.State) (map[proxy.EndpointRef]proxy.EndpointCounter, error) {
	b, _ := s.Current()
	if cr, ok := b.(proxy.CounterReporter); ok {
		return cr.EndpointCounters(st)
	}
	return nil, nil
}

// NodePortScope is the current backend's --nodeport-addresses
// (proxy.NodePortScoper), or the initial backend's when the current one
// has none (the none mode): the service health server follows the mode.
func (s *Switcher) NodePortScope() ([]netip.Prefix, bool) {
	cur, _ := s.Current()
	for _, b := range []proxy.Backend{cur, s.cfg.Initial} {
		if sc, ok := b.(proxy.NodePortScoper); ok {
			return sc.NodePortScope()
		}
	}
	return nil, false
}

// LastSyncFull asks the current backend; for a backend that cannot say,
// the first sync and the one after a failure are full, as without a
// Switcher.
func (s *Switcher) LastSyncFull() bool {
	b, _ := s.Current()
	if r, ok := b.(proxy.FullSyncReporter); ok {
		return r.LastSyncFull()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.full
}

// noteSync records the outcome of a sync of the current backend.
func (s *Switcher) noteSync(first bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		s.full = first || s.failed
	}
	s.failed = err != nil
}

// Shutdown drains the current backend when it proxies connections itself.
func (s *Switcher) Shutdown(ctx context.Context) error {
	b, _ := s.Current()
	if d, ok := b.(proxy.Shutdowner); ok {
		return d.Shutdown(ctx)
	}
	return nil
}

// ListRules lists the current backend's rules (proxy.RuleLister).
func (s *Switcher) ListRules(ctx context.Context) ([]proxy.RuleListing, error) {
	b, t := s.Current()
	if rl, ok := b.(proxy.RuleLister); ok {
		return rl.ListRules(ctx)
	}
	return nil, fmt.Errorf("the %s mode does not list its rules yet", t)
}

// ListAffinity lists the current backend's session affinity entries
// (proxy.AffinityLister).
func (s *Switcher) ListAffinity(ctx context.Context, st *proxy.State) ([]proxy.AffinityEntry, error) {
	b, t := s.Current()
	if al, ok := b.(proxy.AffinityLister); ok {
		return al.ListAffinity(ctx, st)
	}
	return nil, fmt.Errorf("the %s mode does not list its session affinity entries", t)
}
