package source

import (
	"context"

	"github.com/kpproxy/kp/proxy"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// kindWatch is one kind's list/watch and the keyStore its events go
// through.
type kindWatch struct {
	kind     string
	lw       cache.ListerWatcher
	object   runtime.Object // the listed type, for the reflector
	known    cache.KeyListerGetter
	process  cache.ProcessFunc
	streamed cache.TransformFunc // keyStore.deliverStreamed
}

func newKindWatch[T kubeObject](s *keyStore[T], lw cache.ListerWatcher, object T) kindWatch {
	return kindWatch{kind: s.kind, lw: lw, object: any(object).(runtime.Object), known: s, process: s.process,
		streamed: s.deliverStreamed}
}

// listWatch lists and watches through a typed client's List and Watch,
// with tweak applied to every request. Wrapped like client-go's generated
// informers, the reflector streams the initial list (watch-list) from API
// servers that can, and lists from fake clientsets, which cannot.
func listWatch[L runtime.Object](client any, list func(context.Context, metav1.ListOptions) (L, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error), tweak func(*metav1.ListOptions)) cache.ListerWatcher {
	return cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			tweak(&o)
			l, err := list(ctx, o)
			if err != nil {
				return nil, err
			}
			return l, nil
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			tweak(&o)
			return watchFn(ctx, o)
		},
	}, client)
}

func labelSelector(sel labels.Selector) func(*metav1.ListOptions) {
	s := sel.String()
	return func(o *metav1.ListOptions) { o.LabelSelector = s }
}

func (k *KubeSource) serviceWatch(sink proxy.Sink) kindWatch {
	sel := serviceSelector()
	c := k.client.CoreV1().Services(metav1.NamespaceAll)
	s := newKeyStore("Service", k.log,
		func(svc *v1.Service) bool { return sel.Matches(labels.Set(svc.Labels)) }, sink.OnService)
	return newKindWatch(s, listWatch(k.client, c.List, c.Watch, labelSelector(sel)), &v1.Service{})
}

func (k *KubeSource) endpointSliceWatch(sink proxy.Sink) kindWatch {
	sel := endpointSliceSelector()
	c := k.client.DiscoveryV1().EndpointSlices(metav1.NamespaceAll)
	s := newKeyStore("EndpointSlice", k.log,
		func(es *discovery.EndpointSlice) bool { return sel.Matches(labels.Set(es.Labels)) }, sink.OnEndpointSlice)
	return newKindWatch(s, listWatch(k.client, c.List, c.Watch, labelSelector(sel)), &discovery.EndpointSlice{})
}

// nodeWatch watches the proxy's own Node alone (a field selector on its
// name).
func (k *KubeSource) nodeWatch(sink proxy.Sink) kindWatch {
	c := k.client.CoreV1().Nodes()
	byName := fields.OneTermEqualSelector(metav1.ObjectNameField, k.nodeName).String()
	s := newKeyStore("Node", k.log,
		func(n *v1.Node) bool { return n.Name == k.nodeName },
		func(_, name string, n *v1.Node) {
			// The field selector already limits the watch to this node;
			// checking again keeps a deletion of any other Node from
			// clearing ours.
			if name == k.nodeName {
				sink.OnNode(n)
			}
		})
	return newKindWatch(s, listWatch(k.client, c.List, c.Watch, func(o *metav1.ListOptions) { o.FieldSelector = byName }), &v1.Node{})
}

// serviceCIDRWatch watches every ServiceCIDR (cluster-scoped).
func (k *KubeSource) serviceCIDRWatch(sink proxy.Sink) kindWatch {
	c := k.client.NetworkingV1().ServiceCIDRs()
	s := newKeyStore("ServiceCIDR", k.log,
		func(*networkingv1.ServiceCIDR) bool { return true },
		func(_, name string, c *networkingv1.ServiceCIDR) { sink.OnServiceCIDR(name, c) })
	return newKindWatch(s, listWatch(k.client, c.List, c.Watch, func(*metav1.ListOptions) {}), &networkingv1.ServiceCIDR{})
}
