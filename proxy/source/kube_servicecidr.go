package source

import (
	"context"
	"slices"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// servesServiceCIDRs asks the API server whether it serves
// networking.k8s.io/v1 ServiceCIDRs (Kubernetes 1.33 and later): without them
// the informer would never sync, and kp would wait for it forever. It asks
// until the API server answers or ctx is done: taking a connection error for
// "not served" would leave a node that started before its API server without
// ServiceCIDRs for as long as kp runs.
func (k *KubeSource) servesServiceCIDRs(ctx context.Context, status *apiStatus) (bool, error) {
	backoff := time.Second
	for {
		served, err := k.discoverServiceCIDRs(ctx)
		if err == nil {
			if !served {
				k.log.Info("the API server does not serve networking.k8s.io/v1 ServiceCIDRs; traffic to unallocated Service addresses is not dropped")
			}
			return served, nil
		}
		status.record("discovery of networking.k8s.io/v1", err)
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// discoverServiceCIDRs is one discovery request, bounded like a probe.
func (k *KubeSource) discoverServiceCIDRs(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, apiProbeTimeout)
	defer cancel()
	list, err := k.client.Discovery().ServerResourcesForGroupVersion(ctx, networkingv1.SchemeGroupVersion.String())
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return hasServiceCIDRs(list), nil
}

func hasServiceCIDRs(list *metav1.APIResourceList) bool {
	return list != nil && slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == "servicecidrs" })
}
