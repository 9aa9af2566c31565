package source

import (
	"github.com/kpproxy/kp/proxy"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// Transforms. kp keeps no informer cache (see keyStore), but client-go's
// reflector holds a streamed list (watch-list) whole until its end: the
// first one's objects are delivered as they arrive (keyStore.
// deliverStreamed), and a later one, after a watch that could not resume,
// is held in the compact form these transforms make: managed fields,
// annotations kp never reads (kubectl's last-applied-configuration, a copy
// of the whole object, among them), selectors, owner references and target
// references dropped, a third of the room. kp reads a few fields of each
// (the converters in proxy's service.go, endpoints.go and tracker_node.go); the
// compact copy keeps exactly those (TestTransformKeepsWhatKpReads).

// transformObjects strips whatever kind of object the informer delivers;
// tombstones and unknown types pass through.
func transformObjects(obj any) (any, error) {
	switch o := obj.(type) {
	case *v1.Service:
		return compactService(o), nil
	case *discovery.EndpointSlice:
		return compactEndpointSlice(o), nil
	case *v1.Node:
		return compactNode(o), nil
	}
	return obj, nil
}

var _ cache.TransformFunc = transformObjects

// compactMeta keeps an object's identity, its resourceVersion (the
// tracker skips re-delivered versions), and the labels and annotations in
// keep.
func compactMeta(m *metav1.ObjectMeta, labels, annotations []string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, ResourceVersion: m.ResourceVersion,
		Labels: pick(m.Labels, labels), Annotations: pick(m.Annotations, annotations),
	}
}

func pick(m map[string]string, keys []string) map[string]string {
	var out map[string]string
	for _, k := range keys {
		if v, ok := m[k]; ok {
			if out == nil {
				out = make(map[string]string, len(keys))
			}
			out[k] = v
		}
	}
	return out
}

// serviceLabels are the labels the Service handler and ShouldSkipService
// select on; serviceAnnotations the ones ServicePortsFromService reads.
var (
	serviceLabels      = []string{proxy.LabelServiceProxyName}
	serviceAnnotations = []string{v1.AnnotationLoadBalancerSourceRangesKey}
)

// compactService keeps the spec without the selector, which only the
// EndpointSlice controller reads, and the load balancer status.
func compactService(s *v1.Service) *v1.Service {
	c := &v1.Service{ObjectMeta: compactMeta(&s.ObjectMeta, serviceLabels, serviceAnnotations), Spec: s.Spec}
	c.Spec.Selector = nil
	c.Status.LoadBalancer = s.Status.LoadBalancer
	return c
}

// sliceLabels are the labels parseEndpointSlice and the handler's selector
// read; sliceAnnotations the trigger time of the programming latency
// metric.
var (
	sliceLabels      = []string{discovery.LabelServiceName, proxy.LabelServiceProxyName, v1.IsHeadlessService}
	sliceAnnotations = []string{v1.EndpointsLastChangeTriggerTime}
)

// compactEndpointSlice keeps each endpoint's first address (the only one
// kp uses, as upstream), conditions, node, zone and hints; not its target
// reference or deprecated topology.
func compactEndpointSlice(s *discovery.EndpointSlice) *discovery.EndpointSlice {
	c := &discovery.EndpointSlice{
		ObjectMeta:  compactMeta(&s.ObjectMeta, sliceLabels, sliceAnnotations),
		AddressType: s.AddressType,
		Ports:       s.Ports,
		Endpoints:   make([]discovery.Endpoint, len(s.Endpoints)),
	}
	for i, e := range s.Endpoints {
		c.Endpoints[i] = discovery.Endpoint{Conditions: e.Conditions, NodeName: e.NodeName, Zone: e.Zone, Hints: e.Hints}
		if len(e.Addresses) > 0 {
			c.Endpoints[i].Addresses = []string{e.Addresses[0]}
		}
	}
	return c
}

// nodeLabels are the Node labels kp reads (topology); nodeAnnotations the
// mode a switch asks for (AnnotationProxyMode, kp migrate).
var (
	nodeLabels      = []string{v1.LabelTopologyZone}
	nodeAnnotations = []string{proxy.AnnotationProxyMode}
)

// compactNode keeps the Node's addresses and pod CIDRs, and what /healthz's node
// eligibility reads (Health.SyncNode: the deletion timestamp, the cluster
// autoscaler's deletion taint); not its images, conditions, capacity or
// system information, which kubelets keep updating.
func compactNode(n *v1.Node) *v1.Node {
	c := &v1.Node{
		ObjectMeta: compactMeta(&n.ObjectMeta, nodeLabels, nodeAnnotations),
		Spec:       v1.NodeSpec{PodCIDR: n.Spec.PodCIDR, PodCIDRs: n.Spec.PodCIDRs},
		Status:     v1.NodeStatus{Addresses: n.Status.Addresses},
	}
	c.DeletionTimestamp = n.DeletionTimestamp
	for _, t := range n.Spec.Taints {
		if t.Key == proxy.ToBeDeletedTaint {
			c.Spec.Taints = append(c.Spec.Taints, t)
		}
	}
	return c
}
