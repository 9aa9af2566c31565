package proxy

import (
	"maps"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Snapshot returns a new immutable State: the previous one with every Service
// touched since then merged again. Changed lists the ServicePorts that
// differ from the previous snapshot (a Service changed and changed back in
// between is not in it). The maps are new; unchanged *ServicePort values and
// endpoint slices are shared with the previous State, which is safe because
// no State is ever modified after it is returned.
func (t *ChangeTracker) Snapshot() *State {
	t.batchMu.Lock()
	defer t.batchMu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	prev := t.prev
	s := &State{
		Generation:   prev.Generation + 1,
		Services:     maps.Clone(prev.Services),
		Endpoints:    maps.Clone(prev.Endpoints),
		Changed:      make(map[ServicePortName]struct{}),
		TriggerTimes: make(map[ServicePortName]time.Time),
		NodeChanged:  !prev.Node.sameForServices(t.node),
		Node:         t.node,
	}
	if s.Services == nil {
		s.Services = make(map[ServicePortName]*ServicePort)
	}
	if s.Endpoints == nil {
		s.Endpoints = make(map[ServicePortName][]Endpoint)
	}
	for key := range t.dirty {
		t.remerge(s, key)
	}
	t.dirty = emptied(t.dirty)
	t.triggerTimes = emptied(t.triggerTimes)
	t.published = emptied(t.published)
	t.snapshotTaken()
	t.snapshotServiceCIDRs(s)
	t.prev = s
	return s
}

// remerge brings one Service's ports and endpoints in s up to date.
func (t *ChangeTracker) remerge(s *State, key types.NamespacedName) {
	prev := t.prev
	var ports []*ServicePort
	if e := t.services[key]; e != nil {
		ports = e.ports
	}
	infos := t.bySvc[key] // mergeEndpoints leaves it as it is
	names := make([]ServicePortName, 0, len(ports))
	for _, sp := range ports {
		names = append(names, sp.Name)
		eps := mergeEndpoints(sp.Name, infos)
		old, had := prev.Services[sp.Name]
		spSame := had && old.Equal(sp)
		epsSame := EndpointsEqual(prev.Endpoints[sp.Name], eps)
		if !spSame {
			s.Services[sp.Name] = sp
		}
		switch {
		case len(eps) == 0:
			delete(s.Endpoints, sp.Name)
		case !epsSame:
			s.Endpoints[sp.Name] = eps
		}
		if spSame && epsSame {
			continue
		}
		s.Changed[sp.Name] = struct{}{}
		if tt, ok := t.triggerTimes[key]; ok {
			s.TriggerTimes[sp.Name] = tt
		}
	}
	for _, name := range t.published[key] {
		if !slices.Contains(names, name) {
			delete(s.Services, name)
			delete(s.Endpoints, name)
			s.Changed[name] = struct{}{}
		}
	}
}

// emptied returns m emptied. A map keeps the buckets of its largest size
// when cleared: after the first sync, every per-change map would hold room
// for every Service in the cluster (about 5 MB at 10,000) for as long as
// kp runs, so a large one is dropped instead.
func emptied[M ~map[K]V, K comparable, V any](m M) M {
	if len(m) > 256 {
		return make(M)
	}
	clear(m)
	return m
}
