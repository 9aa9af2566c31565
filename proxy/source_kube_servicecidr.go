package proxy

import (
	"context"
	"encoding/json"
	"fmt"
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
	gv := networkingv1.SchemeGroupVersion.String()
	rc := k.client.Discovery().RESTClient()
	if rc == nil { // fake clientsets: nothing to connect to, so nothing to retry
		list, err := k.client.Discovery().ServerResourcesForGroupVersion(gv)
		return err == nil && hasServiceCIDRs(list), nil
	}
	ctx, cancel := context.WithTimeout(ctx, apiProbeTimeout)
	defer cancel()
	// kp's client prefers protobuf, which discovery documents are served in
	// too: ask for JSON, as client-go's discovery client does.
	raw, err := rc.Get().AbsPath("/apis", gv).SetHeader("Accept", "application/json").Do(ctx).Raw()
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	var list metav1.APIResourceList
	if err := json.Unmarshal(raw, &list); err != nil {
		return false, fmt.Errorf("decode: %w", err)
	}
	return hasServiceCIDRs(&list), nil
}

func hasServiceCIDRs(list *metav1.APIResourceList) bool {
	return list != nil && slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == "servicecidrs" })
}
