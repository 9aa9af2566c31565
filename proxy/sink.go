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
