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
// between is not in it). Unchanged *ServicePort values and endpoint slices
// are shared with the previous State, and so is a whole map that no change
// touched (the Services map, while only endpoints change): safe because no
// State is ever modified after it is returned. A map a change touches is
// copied first.
func (t *ChangeTracker) Snapshot() *State {
	t.batchMu.Lock()
	defer t.batchMu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	prev := t.prev
	s := &State{
		Generation:   prev.Generation + 1,
		Changed:      make(map[ServicePortName]struct{}),
		TriggerTimes: make(map[ServicePortName]time.Time),
		NodeChanged:  !prev.Node.sameForServices(t.node),
		Node:         t.node,
	}
	svcs, eps := sharedMap(prev.Services), sharedMap(prev.Endpoints)
	for key := range t.dirty {
		t.remerge(s, &svcs, &eps, key)
	}
	s.Services, s.Endpoints = svcs.m, eps.m
	t.dirty = emptied(t.dirty)
	t.triggerTimes = emptied(t.triggerTimes)
	t.published = emptied(t.published)
	t.snapshotTaken()
	t.snapshotServiceCIDRs(s)
	t.prev = s
	return s
}

// remerge brings one Service's ports and endpoints in s up to date, in
// svcs and eps (s's maps to be).
func (t *ChangeTracker) remerge(s *State, svcs *cowMap[ServicePortName, *ServicePort], epsOf *cowMap[ServicePortName, []Endpoint], key types.NamespacedName) {
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
			svcs.set(sp.Name, sp)
		}
		switch {
		case len(eps) == 0:
			epsOf.del(sp.Name)
		case !epsSame:
			epsOf.set(sp.Name, eps)
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
			svcs.del(name)
			epsOf.del(name)
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

// cowMap is a map shared with the previous State until its first change,
// which copies it: an endpoint change copies the Endpoints map only, not
// the Services map as well (at 10,000 Services, the two copies were an
// eighth of kp's CPU under churn, and more in garbage collection:
// test/bench/NOTES.md).
type cowMap[K comparable, V any] struct {
	m     map[K]V
	owned bool
}

func sharedMap[K comparable, V any](m map[K]V) cowMap[K, V] {
	if m == nil {
		return cowMap[K, V]{m: make(map[K]V), owned: true}
	}
	return cowMap[K, V]{m: m}
}

func (c *cowMap[K, V]) set(k K, v V) {
	c.own()
	c.m[k] = v
}

func (c *cowMap[K, V]) del(k K) {
	if _, ok := c.m[k]; !ok {
		return
	}
	c.own()
	delete(c.m, k)
}

func (c *cowMap[K, V]) own() {
	if !c.owned {
		c.m, c.owned = maps.Clone(c.m), true
	}
}
