package source

import (
	"slices"
	"testing"

	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kpproxy/kp/proxy/proxytest"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
)

func TestKubeSourceDeliversServiceCIDRsWhenServed(t *testing.T) {
	client := fake.NewClientset(kubeNode("node-a"), proxytest.ServiceCIDR("kubernetes", "10.96.0.0/16"))
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
	client := fake.NewClientset(kubeNode("node-a"), proxytest.ServiceCIDR("kubernetes", "10.96.0.0/16"))
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

func TestServiceCIDRDiscoveryRetriesUntilTheAPIServerAnswers(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/apis/networking.k8s.io/v1" {
			http.NotFound(w, r)
			return
		}
		if calls.Add(1) <= 2 {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		if strings.HasPrefix(r.Header.Get("Accept"), "application/vnd.kubernetes.protobuf") {
			// The real API server answers in the client's first choice.
			w.Header().Set("Content-Type", "application/vnd.kubernetes.protobuf")
			fmt.Fprint(w, "k8s\x00\x0a\x0fAPIResourceList")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"networking.k8s.io/v1",`+
			`"resources":[{"name":"servicecidrs","namespaced":false,"kind":"ServiceCIDR","verbs":["list","watch"]}]}`)
	}))
	defer srv.Close()
	client, err := KubeClientFor(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	src := NewKubeSource(client, "node-a", 0, slog.New(slog.NewTextHandler(logs, nil)))
	status := &apiStatus{log: src.log, interval: time.Minute}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	served, err := src.servesServiceCIDRs(ctx, status)
	if err != nil || !served {
		t.Fatalf("servesServiceCIDRs = %v, %v after the API server came up; want true", served, err)
	}
	if calls.Load() != 3 || !strings.Contains(status.lastError(), "discovery of networking.k8s.io/v1") {
		t.Errorf("calls %d, last error %q: want two failed attempts, reported", calls.Load(), status.lastError())
	}

	// A group the API server does not serve is an answer, not an error.
	old := httptest.NewServer(http.NotFoundHandler())
	defer old.Close()
	client, _ = KubeClientFor(&rest.Config{Host: old.URL})
	src = NewKubeSource(client, "node-a", 0, slog.New(slog.NewTextHandler(logs, nil)))
	if served, err := src.servesServiceCIDRs(ctx, status); err != nil || served {
		t.Errorf("servesServiceCIDRs on a server without the group = %v, %v; want false, nil", served, err)
	}
}
