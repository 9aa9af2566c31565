package proxy

import (
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// Sink receives the objects a Source observes. The ChangeTracker implements
// it. Calls may come from several goroutines. A nil object means the object
// identified by namespace/name was deleted.
type Sink interface {
	OnService(namespace, name string, svc *v1.Service)
	OnEndpointSlice(namespace, name string, slice *discovery.EndpointSlice)
	// OnNode reports the proxy's own Node (nil when it is unknown or gone).
	OnNode(node *v1.Node)
	// OnSynced reports that the source delivered its complete initial view;
	// no sync happens before every source said so.
	OnSynced()
}
