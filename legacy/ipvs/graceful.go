package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// DefaultDrainBound is how long a drained real server may keep inactive
// connections (closing ones: FIN_WAIT, TIME_WAIT, which IPVS keeps for
// up to 2 minutes) before kp deletes it. An active connection is never cut:
// a server with one stays at weight 0 as long as it lasts.
const DefaultDrainBound = time.Minute

type drainKey struct {
	key  vsKey
	dest netip.AddrPort
}

// graceful is upstream's graceful termination manager: real servers kp no
// longer wants, at weight 0 (IPVS sends them no new connection), deleted
// once they hold no connection, or no active one after bound.
type graceful struct {
	bound time.Duration
	since map[drainKey]time.Time
}

func newGraceful(bound time.Duration) *graceful {
	return &graceful{bound: bound, since: map[drainKey]time.Time{}}
}

func (g *graceful) add(k vsKey, d netip.AddrPort, now time.Time) {
	if _, ok := g.since[drainKey{k, d}]; !ok {
		g.since[drainKey{k, d}] = now
	}
}

func (g *graceful) forget(k vsKey, d netip.AddrPort) { delete(g.since, drainKey{k, d}) }

func (g *graceful) len() int { return len(g.since) }

// has reports whether kp drains real server d of k.
func (g *graceful) has(k vsKey, d netip.AddrPort) bool {
	_, ok := g.since[drainKey{k, d}]
	return ok
}

// check deletes the draining real servers that hold no connection any
// more or were drained longer than the bound, and forgets those that are
// gone or wanted again (weight back to 1).
func (g *graceful) check(h Handle, now time.Time) error {
	byServer := map[vsKey][]netip.AddrPort{}
	for dk := range g.since {
		byServer[dk.key] = append(byServer[dk.key], dk.dest)
	}
	var errs []error
	for k, dests := range byServer {
		svc := keyService(k)
		if !h.IsServicePresent(svc) {
			for _, d := range dests {
				g.forget(k, d)
			}
			continue
		}
		kd, err := h.GetDestinations(svc)
		if err != nil {
			errs = append(errs, fmt.Errorf("read the real servers of %s: %w", k, err))
			continue
		}
		for _, d := range dests {
			var cur = -1
			for i, x := range kd {
				if destAddrPort(x) == d {
					cur = i
				}
			}
			switch {
			case cur < 0 || kd[cur].Weight != 0:
				g.forget(k, d)
			case kd[cur].ActiveConnections == 0 && (kd[cur].InactiveConnections == 0 || now.Sub(g.since[drainKey{k, d}]) >= g.bound):
				if err := h.DelDestination(svc, kd[cur]); err != nil {
					errs = append(errs, fmt.Errorf("delete drained real server %s of %s: %w", d, k, err))
					continue
				}
				g.forget(k, d)
			}
		}
	}
	return errors.Join(errs...)
}
