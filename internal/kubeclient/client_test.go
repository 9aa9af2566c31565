package kubeclient

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// request is what the test server saw of one request.
type request struct {
	method, path, query, contentType, body string
}

// apiServer answers every request with an object of the kind its path
// names (JSON), and a watch with one ADDED event, recording the requests.
func apiServer(t *testing.T) (*Client, func() []request) {
	t.Helper()
	var mu sync.Mutex
	var seen []request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, request{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Content-Type"), string(body)})
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Query().Get("watch") == "true":
			ev := map[string]any{"type": "ADDED", "object": map[string]any{"kind": "Service", "apiVersion": "v1",
				"metadata": map[string]any{"name": "web", "namespace": "default"}}}
			_ = json.NewEncoder(w).Encode(ev)
		case r.URL.Path == "/version":
			_, _ = io.WriteString(w, `{"major":"1","minor":"36"}`)
		case strings.HasPrefix(r.URL.Path, "/apis/networking.k8s.io/v1") && !strings.Contains(r.URL.Path, "servicecidrs"):
			_, _ = io.WriteString(w, `{"kind":"APIResourceList","groupVersion":"networking.k8s.io/v1","resources":[{"name":"servicecidrs","kind":"ServiceCIDR"}]}`)
		case strings.HasSuffix(r.URL.Path, "/services"):
			_, _ = io.WriteString(w, `{"kind":"ServiceList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":[{"metadata":{"name":"web","namespace":"default"}}]}`)
		case strings.Contains(r.URL.Path, "/nodes/"):
			_, _ = io.WriteString(w, `{"kind":"Node","apiVersion":"v1","metadata":{"name":"node-a","annotations":{"a":"b"}}}`)
		case strings.Contains(r.URL.Path, "/daemonsets/") && r.Method == http.MethodDelete:
			_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Success"}`)
		case strings.Contains(r.URL.Path, "/daemonsets/"):
			_, _ = io.WriteString(w, `{"kind":"DaemonSet","apiVersion":"apps/v1","metadata":{"name":"kp","namespace":"kube-system","generation":3}}`)
		case strings.Contains(r.URL.Path, "/events"):
			_, _ = io.WriteString(w, `{"kind":"Event","apiVersion":"v1","metadata":{"name":"ev","namespace":"default"}}`)
		case strings.Contains(r.URL.Path, "/proxy/"):
			w.Header().Set("Content-Type", "text/plain")
			_, _ = io.WriteString(w, "ok")
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	c, err := New(&rest.Config{Host: srv.URL, QPS: 50, Burst: 100})
	if err != nil {
		t.Fatal(err)
	}
	return c, func() []request {
		mu.Lock()
		defer mu.Unlock()
		return append([]request(nil), seen...)
	}
}

func TestRequestsAreThoseOfClientGosTypedClients(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name string
		call func(*Client) error
		want request
	}{
		{"list services in every namespace, with selectors", func(c *Client) error {
			l, err := c.CoreV1().Services("").List(ctx, metav1.ListOptions{LabelSelector: "!a", ResourceVersion: "0"})
			if err == nil && (len(l.Items) != 1 || l.Items[0].Name != "web" || l.ResourceVersion != "7") {
				t.Errorf("decoded list = %+v", l)
			}
			return err
		}, request{method: "GET", path: "/api/v1/services", query: "labelSelector=%21a&resourceVersion=0"}},
		{"watch endpoint slices streams events", func(c *Client) error {
			w, err := c.DiscoveryV1().EndpointSlices("").Watch(ctx, metav1.ListOptions{ResourceVersion: "7", AllowWatchBookmarks: true})
			if err != nil {
				return err
			}
			defer w.Stop()
			if ev := <-w.ResultChan(); ev.Type != watch.Added {
				t.Errorf("first event = %v, want ADDED", ev.Type)
			}
			return nil
		}, request{method: "GET", path: "/apis/discovery.k8s.io/v1/endpointslices", query: "allowWatchBookmarks=true&resourceVersion=7&watch=true"}},
		{"get a cluster-scoped node", func(c *Client) error {
			n, err := c.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
			if err == nil && n.Annotations["a"] != "b" {
				t.Errorf("decoded node = %+v", n)
			}
			return err
		}, request{method: "GET", path: "/api/v1/nodes/node-a"}},
		{"merge-patch a node", func(c *Client) error {
			_, err := c.CoreV1().Nodes().Patch(ctx, "node-a", types.MergePatchType, []byte(`{"metadata":{}}`), metav1.PatchOptions{})
			return err
		}, request{method: "PATCH", path: "/api/v1/nodes/node-a", contentType: "application/merge-patch+json", body: `{"metadata":{}}`}},
		{"create an event in its namespace", func(c *Client) error {
			_, err := c.CoreV1().Events("default").Create(ctx, &v1.Event{ObjectMeta: metav1.ObjectMeta{Name: "ev"}}, metav1.CreateOptions{})
			return err
		}, request{method: "POST", path: "/api/v1/namespaces/default/events", contentType: "application/json"}},
		{"update a daemonset by its name", func(c *Client) error {
			ds, err := c.AppsV1().DaemonSets("kube-system").Update(ctx, &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "kp"}}, metav1.UpdateOptions{})
			if err == nil && ds.Generation != 3 {
				t.Errorf("decoded daemonset = %+v", ds)
			}
			return err
		}, request{method: "PUT", path: "/apis/apps/v1/namespaces/kube-system/daemonsets/kp", contentType: "application/json"}},
		{"delete a daemonset", func(c *Client) error {
			return c.AppsV1().DaemonSets("kube-system").Delete(ctx, "kube-proxy", metav1.DeleteOptions{})
		}, request{method: "DELETE", path: "/apis/apps/v1/namespaces/kube-system/daemonsets/kube-proxy", contentType: "application/json"}},
		{"the API server's version", func(c *Client) error {
			return c.Discovery().ServerVersion(ctx)
		}, request{method: "GET", path: "/version"}},
		{"a group's resources", func(c *Client) error {
			l, err := c.Discovery().ServerResourcesForGroupVersion(ctx, "networking.k8s.io/v1")
			if err == nil && (len(l.APIResources) != 1 || l.APIResources[0].Name != "servicecidrs") {
				t.Errorf("decoded resources = %+v", l)
			}
			return err
		}, request{method: "GET", path: "/apis/networking.k8s.io/v1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, seen := apiServer(t)
			if err := tt.call(c); err != nil {
				t.Fatal(err)
			}
			got := seen()
			if len(got) != 1 {
				t.Fatalf("requests = %+v, want one", got)
			}
			if tt.want.body == "" {
				got[0].body = ""
			}
			if tt.want.contentType == "" {
				got[0].contentType = ""
			}
			if got[0] != tt.want {
				t.Errorf("request = %+v\nwant      %+v", got[0], tt.want)
			}
		})
	}
}

func TestNotServedGroupIsNotFound(t *testing.T) {
	c, _ := apiServer(t)
	_, err := c.Discovery().ServerResourcesForGroupVersion(context.Background(), "storagemigration.k8s.io/v1alpha1")
	if !apierrors.IsNotFound(err) {
		t.Errorf("err = %v, want NotFound", err)
	}
}

// The scheme knows the kinds kp reads and writes, and only their groups.
func TestSchemeHoldsOnlyKpsGroups(t *testing.T) {
	groups := map[string]bool{}
	for gvk := range scheme.AllKnownTypes() {
		groups[gvk.Group] = true
	}
	for _, g := range []string{"", "discovery.k8s.io", "networking.k8s.io", "apps"} {
		if !groups[g] {
			t.Errorf("group %q missing from the scheme", g)
		}
		delete(groups, g)
	}
	if len(groups) > 0 {
		t.Errorf("groups kp does not use in the scheme: %v", groups)
	}
}
