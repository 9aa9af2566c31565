package source

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"net"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/kpproxy/kp/internal/kubeclient/fromclientset"
	"github.com/kpproxy/kp/proxy"
)

func kubeService(ns, name string, labels map[string]string) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec:       v1.ServiceSpec{ClusterIP: "10.96.0.10", Ports: []v1.ServicePort{{Port: 80}}},
	}
}

func kubeSlice(ns, name string, labels map[string]string) *discovery.EndpointSlice {
	return &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		AddressType: discovery.AddressTypeIPv4,
	}
}

func kubeNode(name string) *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

// startKubeSource runs a KubeSource over client until stop is called or the
// test ends. done reports Run's result (stop returns it too).
func startKubeSource(t *testing.T, client *fake.Clientset) (sink *recordingSink, logs *lockedBuffer, stop func() error, done <-chan error) {
	t.Helper()
	logs = &lockedBuffer{}
	src := NewKubeSource(fromclientset.New(client), "node-a", 0, slog.New(slog.NewTextHandler(logs, nil)))
	src.waitLogInterval = 20 * time.Millisecond
	sink = newRecordingSink()
	ctx, cancel := context.WithCancel(context.Background())
	result := make(chan error, 1)
	go func() { result <- src.Run(ctx, sink) }()
	stop = sync.OnceValue(func() error {
		cancel()
		select {
		case err := <-result:
			return err
		case <-time.After(5 * time.Second):
			return errors.New("Run did not return within 5s of cancel")
		}
	})
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return sink, logs, stop, result
}

func TestKubeSourceInitialSync(t *testing.T) {
	client := fake.NewClientset(
		kubeService("default", "web", nil),
		kubeService("default", "other-proxy", map[string]string{proxy.LabelServiceProxyName: "other"}),
		kubeSlice("default", "web-1", map[string]string{discovery.LabelServiceName: "web"}),
		kubeSlice("default", "headless-1", map[string]string{discovery.LabelServiceName: "headless", v1.IsHeadlessService: ""}),
		kubeSlice("default", "other-1", map[string]string{discovery.LabelServiceName: "other-proxy", proxy.LabelServiceProxyName: "other"}),
		kubeNode("node-a"),
		kubeNode("node-b"),
	)
	sink, _, _, _ := startKubeSource(t, client)
	sink.waitSynced(t)

	want := []string{"EndpointSlice default/web-1", "Node", "Service default/web"}
	if got := sink.keys(); !slices.Equal(got, want) {
		t.Errorf("objects = %q, want %q", got, want)
	}
	if node, _ := sink.object("Node").(*v1.Node); node == nil || node.Name != "node-a" {
		t.Errorf("Node = %v, want node-a", node)
	}
	calls := sink.callsSince(0)
	if i := slices.Index(calls, "synced"); i != len(want) {
		t.Errorf("calls = %q, want OnSynced once, after the %d initial objects", calls, len(want))
	}

	// The label selectors reach the API server, which does the filtering
	// for real (the fake filters labels, not fields).
	var selectors []string
	for _, a := range client.Actions() {
		if l, ok := a.(k8stesting.ListAction); ok {
			r := l.GetListRestrictions()
			selectors = append(selectors, a.GetResource().Resource+" "+r.Labels.String()+" "+r.Fields.String())
		}
	}
	slices.Sort(selectors)
	wantSelectors := []string{
		"endpointslices !service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name ",
		"nodes  metadata.name=node-a",
		"services !service.kubernetes.io/service-proxy-name ",
	}
	if !slices.Equal(selectors, wantSelectors) {
		t.Errorf("list selectors = %q, want %q", selectors, wantSelectors)
	}
}

func TestKubeSourceEvents(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(
		kubeService("default", "web", nil),
		kubeSlice("default", "web-1", map[string]string{discovery.LabelServiceName: "web"}),
		kubeNode("node-a"),
		kubeNode("node-b"),
	)
	sink, _, _, _ := startKubeSource(t, client)
	sink.waitSynced(t)

	steps := []struct {
		name   string
		action func() error
		want   []string // objects known afterwards
	}{
		{
			name: "added Service is delivered",
			action: func() error {
				_, err := client.CoreV1().Services("shop").Create(ctx, kubeService("shop", "api", nil), metav1.CreateOptions{})
				return err
			},
			want: []string{"EndpointSlice default/web-1", "Node", "Service default/web", "Service shop/api"},
		},
		{
			name: "Service handed to another proxy is delivered as deleted",
			action: func() error {
				svc := kubeService("shop", "api", map[string]string{proxy.LabelServiceProxyName: "other"})
				_, err := client.CoreV1().Services("shop").Update(ctx, svc, metav1.UpdateOptions{})
				return err
			},
			want: []string{"EndpointSlice default/web-1", "Node", "Service default/web"},
		},
		{
			name: "deleted EndpointSlice is delivered as deleted",
			action: func() error {
				return client.DiscoveryV1().EndpointSlices("default").Delete(ctx, "web-1", metav1.DeleteOptions{})
			},
			want: []string{"Node", "Service default/web"},
		},
		{
			name: "another node's deletion leaves the Node alone, its own removes it",
			action: func() error {
				if err := client.CoreV1().Nodes().Delete(ctx, "node-b", metav1.DeleteOptions{}); err != nil {
					return err
				}
				return client.CoreV1().Nodes().Delete(ctx, "node-a", metav1.DeleteOptions{})
			},
			want: []string{"Service default/web"},
		},
	}
	for _, step := range steps {
		before := sink.callCount()
		if err := step.action(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		sink.waitFor(t, step.name, func() bool { return slices.Equal(sink.keys(), step.want) })
		if step.name == "another node's deletion leaves the Node alone, its own removes it" {
			if got := sink.callsSince(before); !slices.Equal(got, []string{"delete Node"}) {
				t.Errorf("%s: calls = %q, want one Node deletion", step.name, got)
			}
		}
	}
}

func kubeServiceAt(ns, name, rv string, labels map[string]string) *v1.Service {
	svc := kubeService(ns, name, labels)
	svc.ResourceVersion = rv
	return svc
}

// TestKeyStore feeds one kind's events (client-go deltas) to its keyStore
// and checks what reaches the sink.
func TestKeyStore(t *testing.T) {
	src := NewKubeSource(fromclientset.New(fake.NewClientset()), "node-a", 0, slog.New(slog.DiscardHandler))
	web := kubeServiceAt("default", "web", "1", nil)
	web2 := kubeServiceAt("default", "web", "2", nil)
	other := kubeServiceAt("default", "web", "3", map[string]string{proxy.LabelServiceProxyName: "other"})
	add := func(o runtime.Object) cache.Delta { return cache.Delta{Type: cache.Added, Object: o} }
	update := func(o runtime.Object) cache.Delta { return cache.Delta{Type: cache.Updated, Object: o} }
	del := func(o any) cache.Delta { return cache.Delta{Type: cache.Deleted, Object: o} }
	tests := []struct {
		name string
		svc  []cache.Delta
		node []cache.Delta
		want []string
	}{
		{name: "added Service is delivered", svc: []cache.Delta{add(web)}, want: []string{"set Service default/web"}},
		{name: "added Service for another proxy is not", svc: []cache.Delta{add(other)}},
		{
			name: "a version already delivered is not delivered again, a new one is",
			svc:  []cache.Delta{add(web), {Type: cache.Replaced, Object: web}, update(web2)},
			want: []string{"set Service default/web", "set Service default/web"},
		},
		{
			name: "Service relabelled for another proxy is delivered as deleted, and back as set",
			svc:  []cache.Delta{add(web), update(other), update(web2)},
			want: []string{"set Service default/web", "delete Service default/web", "set Service default/web"},
		},
		{
			name: "deleted Service is delivered as deleted",
			svc:  []cache.Delta{add(web), del(web2)},
			want: []string{"set Service default/web", "delete Service default/web"},
		},
		{name: "deletion of a Service never delivered is dropped", svc: []cache.Delta{del(web)}},
		{
			name: "tombstone (a relist's deletion) is a deletion by key",
			svc:  []cache.Delta{add(web), del(cache.DeletedFinalStateUnknown{Key: "default/web"})},
			want: []string{"set Service default/web", "delete Service default/web"},
		},
		{
			name: "another node is ignored, even by tombstone",
			node: []cache.Delta{add(kubeNode("node-b")), del(cache.DeletedFinalStateUnknown{Key: "node-b"})},
		},
		{
			name: "tombstone of the proxy's node clears it",
			node: []cache.Delta{add(kubeNode("node-a")), del(cache.DeletedFinalStateUnknown{Key: "node-a"})},
			want: []string{"set Node", "delete Node"},
		},
		{name: "unexpected type is dropped", svc: []cache.Delta{add(kubeNode("node-a"))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sink := newRecordingSink()
			svc, node := src.serviceWatch(sink), src.nodeWatch(sink)
			for _, d := range tt.svc {
				if err := svc.process(cache.Deltas{d}, false); err != nil {
					t.Fatal(err)
				}
			}
			for _, d := range tt.node {
				if err := node.process(cache.Deltas{d}, false); err != nil {
					t.Fatal(err)
				}
			}
			if got := sink.callsSince(0); !slices.Equal(got, tt.want) {
				t.Errorf("calls = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestKeyStoreRelist: a relist (the reflector's Replace, after a watch
// expired or the API server came back) goes through client-go's queue with
// the keyStore as its known objects: unchanged versions are not delivered
// again, changed ones are, and an object the new list lacks (its deletion
// missed while the watch was down) is delivered as deleted.
func TestKeyStoreRelist(t *testing.T) {
	src := NewKubeSource(fromclientset.New(fake.NewClientset()), "node-a", 0, slog.New(slog.DiscardHandler))
	sink := newRecordingSink()
	w := src.serviceWatch(sink)
	relist := func(objs ...any) []string {
		t.Helper()
		before := sink.callCount()
		fifo := cache.NewRealFIFOWithOptions(cache.RealFIFOOptions{
			KeyFunction: cache.DeletionHandlingMetaNamespaceKeyFunc, KnownObjects: w.known, Transformer: transformObjects})
		if err := fifo.Replace(objs, "100"); err != nil {
			t.Fatal(err)
		}
		fifo.Close()
		for {
			if _, err := fifo.Pop(cache.PopProcessFunc(w.process)); err != nil {
				break
			}
		}
		return sink.callsSince(before)
	}
	steps := []struct {
		name string
		list []any
		want []string
	}{
		{"first list delivers everything", []any{kubeServiceAt("default", "web", "1", nil), kubeServiceAt("shop", "api", "1", nil)},
			[]string{"set Service default/web", "set Service shop/api"}},
		{"relist delivers changed versions alone", []any{kubeServiceAt("default", "web", "1", nil), kubeServiceAt("shop", "api", "2", nil)},
			[]string{"set Service shop/api"}},
		{"relist without an object delivers its deletion", []any{kubeServiceAt("default", "web", "1", nil)},
			[]string{"delete Service shop/api"}},
		{"relist with it relabelled for another proxy delivers its deletion",
			[]any{kubeServiceAt("default", "web", "2", map[string]string{proxy.LabelServiceProxyName: "other"})},
			[]string{"delete Service default/web"}},
	}
	for _, s := range steps {
		if got := relist(s.list...); !slices.Equal(got, s.want) {
			t.Errorf("%s: calls = %q, want %q", s.name, got, s.want)
		}
	}
	if got := w.known.ListKeys(); len(got) != 0 {
		t.Errorf("keys kept after every object went: %q", got)
	}
}

func TestKubeSourceWaitsForAPIServer(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("list", "services", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("dial tcp 10.0.0.1:6443: connect: connection refused")
	})
	sink, logs, stop, done := startKubeSource(t, client)
	waitLog(t, logs, "waiting for the API server")
	waitLog(t, logs, "connection refused")
	if n := sink.callCount(); n != 0 {
		t.Errorf("sink got %q before the API server answered", sink.callsSince(0))
	}
	select {
	case err := <-done:
		t.Fatalf("Run returned %v while the API server is unreachable", err)
	default:
	}
	if err := stop(); err != nil {
		t.Errorf("Run = %v after cancel, want nil", err)
	}
	if !strings.Contains(logs.String(), "list/watch Service") {
		t.Errorf("the waiting log does not name the failing kind:\n%s", logs)
	}
}

func TestKubeClientConfig(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	if _, err := NewKubeClient("", ""); err == nil || !strings.Contains(err.Error(), "--kubeconfig") {
		t.Errorf("NewKubeClient outside a cluster = %v, want an error pointing at --kubeconfig", err)
	}
	if _, err := NewKubeClient("", "https://127.0.0.1:6443"); err != nil {
		t.Errorf("NewKubeClient with --master: %v", err)
	}
	if _, err := NewKubeClient(filepath.Join(t.TempDir(), "missing"), ""); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("NewKubeClient with a missing kubeconfig = %v, want an error naming it", err)
	}
}

func TestKubeSourceNeedsNodeName(t *testing.T) {
	src := NewKubeSource(fromclientset.New(fake.NewClientset()), "", 0, slog.New(slog.DiscardHandler))
	if err := src.Run(context.Background(), newRecordingSink()); err == nil {
		t.Error("Run without a node name succeeded, want an error")
	}
}

func TestKubeSourceSaysWhyItWaitsWhenTheAPIServerDoesNotAnswer(t *testing.T) {
	// An API server behind a black hole: connections are accepted and
	// never answered, so client-go's list hangs and reports nothing.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	client, err := KubeClientFor(&rest.Config{Host: "http://" + ln.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	src := NewKubeSource(client, "node-a", 0, slog.New(slog.NewTextHandler(logs, nil)))
	src.waitLogInterval = 20 * time.Millisecond
	src.probe = probeAPIServer(client, 50*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, newRecordingSink()) }()
	defer func() {
		cancel()
		<-done
	}()
	waitLog(t, logs, "waiting for the API server")
	waitLog(t, logs, "context deadline exceeded")
}

func TestKubeSourceReportsTheAPIServerGoingAwayAndComingBack(t *testing.T) {
	logs := &lockedBuffer{}
	src := NewKubeSource(fromclientset.New(fake.NewClientset()), "node-a", 0, slog.New(slog.NewTextHandler(logs, nil)))
	src.errorLogInterval = 10 * time.Millisecond
	var mu sync.Mutex
	var probeErr error
	src.probe = func(context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		return probeErr
	}
	setProbe := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		probeErr = err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	sink := newRecordingSink()
	go func() { done <- src.Run(ctx, sink) }()
	defer func() {
		cancel()
		<-done
	}()
	waitLog(t, logs, "caches synced")
	setProbe(errors.New("dial tcp 10.0.0.1:6443: connect: connection refused"))
	waitLog(t, logs, "API server unreachable")
	waitLog(t, logs, "connection refused")
	setProbe(nil)
	waitLog(t, logs, "API server reachable again")
	if n := strings.Count(logs.String(), "API server unreachable"); n != 1 {
		t.Errorf("one outage logged %d times:\n%s", n, logs)
	}
}

// TestStreamQueue plays a reflector's streamed lists (watch-list) through
// a kind's queue: the first list's objects reach the sink as they stream
// and the reflector keeps stand-ins; the list's end finds the deletions; a
// later list is compacted and delivered from the queue.
func TestStreamQueue(t *testing.T) {
	src := NewKubeSource(fromclientset.New(fake.NewClientset()), "node-a", 0, slog.New(slog.DiscardHandler))
	sink := newRecordingSink()
	w := src.serviceWatch(sink)
	q := newStreamQueue(w, transformObjects, slog.New(slog.DiscardHandler))
	stream := func(objs ...*v1.Service) []any {
		t.Helper()
		var held []any
		for _, o := range objs {
			x, err := q.Transformer()(o)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, x)
		}
		return held
	}
	pop := func(n int) {
		t.Helper()
		for range n {
			if _, err := q.Pop(cache.PopProcessFunc(w.process)); err != nil {
				t.Fatal(err)
			}
		}
	}
	web, api, added := kubeServiceAt("default", "web", "1", nil), kubeServiceAt("shop", "api", "1", nil), kubeServiceAt("shop", "new", "2", nil)
	web.Spec.Selector = map[string]string{"app": "web"}

	// A first attempt streams two objects and fails; the retry streams
	// web again (unchanged), not api (deleted meanwhile), and a new one.
	stream(web, api)
	held := stream(web, added)
	if got, want := sink.callsSince(0), []string{"set Service default/web", "set Service shop/api", "set Service shop/new"}; !slices.Equal(got, want) {
		t.Errorf("streamed: calls = %q, want %q", got, want)
	}
	for _, h := range held {
		if _, ok := h.(*metav1.PartialObjectMetadata); !ok {
			t.Errorf("the reflector holds a %T, want a stand-in", h)
		}
	}
	before := sink.callCount()
	if err := q.Replace(held, "2"); err != nil {
		t.Fatal(err)
	}
	pop(3) // api's deletion, two stand-ins
	if got, want := sink.callsSince(before), []string{"delete Service shop/api"}; !slices.Equal(got, want) {
		t.Errorf("first list's end: calls = %q, want %q", got, want)
	}

	// A later list (a watch that could not resume) is held compacted and
	// delivered from the queue.
	before = sink.callCount()
	web2 := kubeServiceAt("default", "web", "3", nil)
	web2.Spec.Selector = map[string]string{"app": "web"}
	held = stream(web2)
	if svc, ok := held[0].(*v1.Service); !ok || svc.Spec.Selector != nil {
		t.Errorf("a later list is held as %#v, want the compact Service", held[0])
	}
	if n := sink.callCount(); n != before {
		t.Errorf("a later list was delivered as it streamed: %q", sink.callsSince(before))
	}
	if err := q.Replace(held, "3"); err != nil {
		t.Fatal(err)
	}
	pop(2) // new's deletion, web
	if got, want := sink.callsSince(before), []string{"delete Service shop/new", "set Service default/web"}; !slices.Equal(got, want) {
		t.Errorf("later list: calls = %q, want %q", got, want)
	}
}
