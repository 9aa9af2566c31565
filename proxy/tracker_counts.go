package proxy

import "k8s.io/apimachinery/pkg/types"

// ChangeCounts are the tracker's change counters, for upstream's
// kubeproxy_sync_proxy_rules_{service,endpoint}_changes_{total,pending}.
type ChangeCounts struct {
	// ServicesTotal and EndpointsTotal count every Service and
	// EndpointSlice update that changed what the proxy programs.
	ServicesTotal, EndpointsTotal uint64
	// ServicesPending and EndpointsPending count the Services whose
	// Service, or whose endpoints, changed since the last snapshot.
	ServicesPending, EndpointsPending uint64
}

// changeCounter is embedded in ChangeTracker; its fields are guarded by
// the tracker's mutex.
type changeCounter struct {
	counts     ChangeCounts
	pendingSvc map[types.NamespacedName]struct{}
	pendingEps map[types.NamespacedName]struct{}
}

func (c *changeCounter) serviceChanged(key types.NamespacedName) {
	if c.pendingSvc == nil {
		c.pendingSvc = make(map[types.NamespacedName]struct{})
	}
	c.counts.ServicesTotal++
	c.pendingSvc[key] = struct{}{}
}

func (c *changeCounter) endpointsChanged(key types.NamespacedName) {
	if c.pendingEps == nil {
		c.pendingEps = make(map[types.NamespacedName]struct{})
	}
	c.counts.EndpointsTotal++
	c.pendingEps[key] = struct{}{}
}

func (c *changeCounter) snapshotTaken() {
	c.pendingSvc = emptied(c.pendingSvc)
	c.pendingEps = emptied(c.pendingEps)
}

// ChangeCounts returns the change counters.
func (t *ChangeTracker) ChangeCounts() ChangeCounts {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.counts
	c.ServicesPending = uint64(len(t.pendingSvc))
	c.EndpointsPending = uint64(len(t.pendingEps))
	return c
}
