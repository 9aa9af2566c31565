package proxy

import (
	"slices"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// servesServiceCIDRs asks the API server whether it serves
// networking.k8s.io/v1 ServiceCIDRs (Kubernetes 1.33 and later). Without
// them the informer would never sync, and kp would wait for it forever.
func (k *KubeSource) servesServiceCIDRs() bool {
	list, err := k.client.Discovery().ServerResourcesForGroupVersion(networkingv1.SchemeGroupVersion.String())
	if err != nil {
		k.log.Info("ServiceCIDRs unavailable; traffic to unallocated Service addresses is not dropped",
			"error", err.Error())
		return false
	}
	if !slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == "servicecidrs" }) {
		k.log.Info("the API server does not serve networking.k8s.io/v1 ServiceCIDRs; traffic to unallocated Service addresses is not dropped")
		return false
	}
	return true
}

// serviceCIDRInformer returns the ServiceCIDR informer and its handler, or
// nil when the API server does not serve them.
func (k *KubeSource) serviceCIDRInformer(factory informers.SharedInformerFactory, sink Sink) (cache.SharedIndexInformer, cache.ResourceEventHandler) {
	if !k.servesServiceCIDRs() {
		return nil, nil
	}
	return factory.Networking().V1().ServiceCIDRs().Informer(), &objectHandler[*networkingv1.ServiceCIDR]{
		kind:    "ServiceCIDR",
		log:     k.log,
		matches: func(*networkingv1.ServiceCIDR) bool { return true },
		deliver: func(_, name string, c *networkingv1.ServiceCIDR) { sink.OnServiceCIDR(name, c) },
	}
}
