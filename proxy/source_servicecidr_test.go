package proxy

import (
	"slices"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func TestKubeSourceDeliversServiceCIDRsWhenServed(t *testing.T) {
	client := fake.NewClientset(kubeNode("node-a"), serviceCIDR("kubernetes", "10.96.0.0/16"))
	client.Resources = []*metav1.APIResourceList{{
		GroupVersion: networkingv1.SchemeGroupVersion.String(),
		APIResources: []metav1.APIResource{{Name: "servicecidrs", Kind: "ServiceCIDR"}},
	}}
	sink, _, _, _ := startKubeSource(t, client)
	sink.waitSynced(t)
	if got := sink.keys(); !slices.Contains(got, "ServiceCIDR kubernetes") {
		t.Errorf("objects = %q, want the ServiceCIDR", got)
	}
	// Delivered before OnSynced, so the first sync has them.
	calls := sink.callsSince(0)
	if slices.Index(calls, "set ServiceCIDR kubernetes") > slices.Index(calls, "synced") {
		t.Errorf("calls = %q: ServiceCIDR after OnSynced", calls)
	}
}

func TestKubeSourceSyncsWithoutServiceCIDRsWhenNotServed(t *testing.T) {
	client := fake.NewClientset(kubeNode("node-a"), serviceCIDR("kubernetes", "10.96.0.0/16"))
	sink, _, _, _ := startKubeSource(t, client)
	sink.waitSynced(t)
	if got := sink.keys(); slices.Contains(got, "ServiceCIDR kubernetes") {
		t.Errorf("objects = %q: ServiceCIDR delivered though discovery does not list it", got)
	}
}

func TestDirSourceReadsServiceCIDRs(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "cidrs.yaml", `apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata:
  name: kubernetes
  namespace: ignored
spec:
  cidrs: [10.96.0.0/16, "fd00:96::/112"]
`)
	_, sink, _ := startDirSource(t, dir)
	c, _ := sink.object("ServiceCIDR kubernetes").(*networkingv1.ServiceCIDR)
	if c == nil || !slices.Equal(c.Spec.CIDRs, []string{"10.96.0.0/16", "fd00:96::/112"}) || c.Namespace != "" {
		t.Errorf("ServiceCIDR = %+v, want kubernetes with both CIDRs, no namespace", c)
	}
}
