package proxy

import (
	"context"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// Sink receives the objects a Source observes. The ChangeTracker implements
// it. Calls may come from several goroutines. A nil object means the object
// identified by namespace/name was deleted.
type Sink interface {
	OnService(namespace, name string, svc *v1.Service)
	OnEndpointSlice(namespace, name string, slice *discovery.EndpointSlice)
	// OnNode reports the proxy's own Node (nil when it is unknown or gone).
	OnNode(node *v1.Node)
	// OnServiceCIDR reports a networking.k8s.io/v1 ServiceCIDR (nil:
	// deleted); ServiceCIDRs are cluster-scoped, so name alone is the key.
	OnServiceCIDR(name string, cidr *networkingv1.ServiceCIDR)
	// OnSynced reports that the source delivered its complete initial view;
	// no sync happens before every source said so.
	OnSynced()
}

// Source observes Services, EndpointSlices and the proxy's own Node
// somewhere (the kube API, a folder of manifests) and reports them to a Sink.
type Source interface {
	// Run reports every object to sink, calls sink.OnSynced once after the
	// initial view, then reports changes until ctx is done. It returns nil
	// when ctx is done, and an error only when it cannot go on (which stops
	// the proxy).
	Run(ctx context.Context, sink Sink) error
}

// Batcher is a Sink that takes several calls as one change: no snapshot
// holds some of them without the others. The folder source makes each
// reload one batch, so a file's Service and EndpointSlices change together
// (a port removed from both is never, for a sync, a port without
// endpoints). A Sink that is not one takes the calls one by one.
type Batcher interface {
	Batch(fn func())
}

// batch runs fn, whose calls go to sink, as one change of sink when sink
// can take one.
func Batch(sink Sink, fn func()) {
	if b, ok := sink.(Batcher); ok {
		b.Batch(fn)
		return
	}
	fn()
}
