package userspace

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// balancer chooses endpoints for one listener's new connections: round
// robin over its endpoints, ClientIP affinity when the Service asks for it.
// Updates replace the list for new connections only; open connections keep
// the endpoint they have.
type balancer struct {
	now func() time.Time

	mu        sync.Mutex
	endpoints []netip.AddrPort
	next      int
	timeout   time.Duration // 0: no affinity
	affinity  map[netip.Addr]affinityEntry
}

type affinityEntry struct {
	endpoint netip.AddrPort
	last     time.Time
}

func newBalancer(now func() time.Time) *balancer {
	return &balancer{now: now, affinity: map[netip.Addr]affinityEntry{}}
}

// update replaces the endpoints and the affinity timeout. Affinity entries
// pointing at endpoints that are gone are forgotten, so those clients are
// balanced again.
func (b *balancer) update(eps []netip.AddrPort, timeout time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.endpoints = eps
	b.timeout = timeout
	if b.next >= len(eps) {
		b.next = 0
	}
	keep := map[netip.AddrPort]bool{}
	for _, e := range eps {
		keep[e] = true
	}
	for c, a := range b.affinity {
		if timeout == 0 || !keep[a.endpoint] {
			delete(b.affinity, c)
		}
	}
}

// size is the number of endpoints (how many dials a connection may try).
func (b *balancer) size() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.endpoints)
}

// pick returns the endpoint for a new connection from client, skipping the
// endpoints in tried (those whose dial failed for this connection). The
// affinity entry of the client wins while it is fresh and not tried.
func (b *balancer) pick(client netip.Addr, tried map[netip.AddrPort]bool) (netip.AddrPort, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	if b.timeout > 0 {
		if a, ok := b.affinity[client]; ok && now.Sub(a.last) < b.timeout && !tried[a.endpoint] {
			a.last = now
			b.affinity[client] = a
			return a.endpoint, true
		}
	}
	for range b.endpoints {
		e := b.endpoints[b.next]
		b.next = (b.next + 1) % len(b.endpoints)
		if tried[e] {
			continue
		}
		if b.timeout > 0 {
			b.affinity[client] = affinityEntry{endpoint: e, last: now}
		}
		return e, true
	}
	return netip.AddrPort{}, false
}

// expire forgets affinity entries idle past the timeout (called
// periodically so that the map does not grow with every client ever seen).
func (b *balancer) expire() {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	for c, a := range b.affinity {
		if now.Sub(a.last) >= b.timeout {
			delete(b.affinity, c)
		}
	}
}

// familyBalancers are one listener's balancers per IP family: a client
// that reached the Service over IPv4 goes to an IPv4 endpoint.
type familyBalancers struct {
	v4, v6 *balancer
	// clusterV4 and clusterV6, on an external listener under
	// externalTrafficPolicy Local (split set), balance the clients inside
	// the cluster (pods, the node itself) over the Cluster policy's
	// endpoints, as upstream short-circuits them.
	clusterV4, clusterV6 *balancer
	split                atomic.Bool
}

func newFamilyBalancers(now func() time.Time) *familyBalancers {
	return &familyBalancers{v4: newBalancer(now), v6: newBalancer(now), clusterV4: newBalancer(now), clusterV6: newBalancer(now)}
}

// of is the balancer for traffic that arrived at local address a.
func (f *familyBalancers) of(a netip.Addr) *balancer {
	if a.Unmap().Is4() {
		return f.v4
	}
	return f.v6
}

// forClient is the balancer for a client that reached local address a:
// the cluster balancers for a client inside the cluster (asked only then),
// when there are some.
func (f *familyBalancers) forClient(a netip.Addr, inCluster func() bool) *balancer {
	if f.split.Load() && inCluster() {
		return f.clusterOf(a)
	}
	return f.of(a)
}

// clusterOf is the cluster balancer for traffic that arrived at a.
func (f *familyBalancers) clusterOf(a netip.Addr) *balancer {
	if a.Unmap().Is4() {
		return f.clusterV4
	}
	return f.clusterV6
}

func (f *familyBalancers) expire() {
	f.v4.expire()
	f.v6.expire()
	f.clusterV4.expire()
	f.clusterV6.expire()
}
