package source

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kpproxy/kp/test/logbuf"
)

// recordingSink is a Sink that records every call and keeps the resulting
// view of the world, for tests to wait on.
type recordingSink struct {
	mu      sync.Mutex
	calls   []string
	objects map[string]runtime.Object // "Service ns/name", "Node" → object
	synced  int
	notify  chan struct{}
}

func newRecordingSink() *recordingSink {
	return &recordingSink{objects: make(map[string]runtime.Object), notify: make(chan struct{}, 1)}
}

func (r *recordingSink) record(key string, obj runtime.Object, isNil bool) {
	r.mu.Lock()
	if isNil {
		r.calls = append(r.calls, "delete "+key)
		delete(r.objects, key)
	} else {
		r.calls = append(r.calls, "set "+key)
		r.objects[key] = obj
	}
	r.mu.Unlock()
	r.poke()
}

func (r *recordingSink) poke() {
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

func (r *recordingSink) OnService(ns, name string, svc *v1.Service) {
	r.record("Service "+ns+"/"+name, svc, svc == nil)
}

func (r *recordingSink) OnEndpointSlice(ns, name string, s *discovery.EndpointSlice) {
	r.record("EndpointSlice "+ns+"/"+name, s, s == nil)
}

func (r *recordingSink) OnNode(n *v1.Node) {
	r.record("Node", n, n == nil)
}

func (r *recordingSink) OnServiceCIDR(name string, c *networkingv1.ServiceCIDR) {
	r.record("ServiceCIDR "+name, c, c == nil)
}

func (r *recordingSink) OnSynced() {
	r.mu.Lock()
	r.calls = append(r.calls, "synced")
	r.synced++
	r.mu.Unlock()
	r.poke()
}

// keys returns the objects currently known, sorted.
func (r *recordingSink) keys() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.objects))
}

func (r *recordingSink) object(key string) runtime.Object {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.objects[key]
}

// callsSince returns the calls recorded after the first n.
func (r *recordingSink) callsSince(n int) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls[n:])
}

func (r *recordingSink) callCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.calls)
}

// waitFor waits until cond holds, re-checking after every sink call.
func (r *recordingSink) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(5 * time.Second)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-r.notify:
		case <-deadline.C:
			r.mu.Lock()
			defer r.mu.Unlock()
			t.Fatalf("timed out waiting for %s; calls: %q", what, r.calls)
		}
	}
}

func (r *recordingSink) waitSynced(t *testing.T) {
	t.Helper()
	r.waitFor(t, "OnSynced", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.synced > 0
	})
}

// servicePort returns the first port of a recorded Service, or 0.
func (r *recordingSink) servicePort(key string) int32 {
	svc, _ := r.object(key).(*v1.Service)
	if svc == nil || len(svc.Spec.Ports) == 0 {
		return 0
	}
	return svc.Spec.Ports[0].Port
}

// lockedBuffer collects log output written from the source's goroutine.
type lockedBuffer = logbuf.Buffer

func serviceYAML(name string, port int) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata:
  name: %s
spec:
  clusterIP: 10.96.0.10
  ports:
  - port: %d
`, name, port)
}

func sliceYAML(name, service string) string {
	return fmt.Sprintf(`apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %s
  namespace: shop
  labels:
    kubernetes.io/service-name: %s
addressType: IPv4
endpoints:
- addresses: [10.1.0.5]
ports:
- port: 8080
`, name, service)
}

const nodeYAML = `apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels:
    topology.kubernetes.io/zone: zone-1
---
apiVersion: v1
kind: Node
metadata:
  name: node-b
`

const serviceListJSON = `{
  "apiVersion": "v1",
  "kind": "List",
  "items": [
    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "api", "namespace": "shop"},
     "spec": {"clusterIP": "10.96.0.20", "ports": [{"port": 443}]}},
    {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
     "metadata": {"name": "api-1", "namespace": "shop", "labels": {"kubernetes.io/service-name": "api"}},
     "addressType": "IPv4", "endpoints": [{"addresses": ["10.1.0.9"]}]}
  ]
}`

func writeFile(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// startDirSource runs a DirSource over dir until the test ends and waits for
// its initial sync.
func startDirSource(t *testing.T, dir string) (*DirSource, *recordingSink, *lockedBuffer) {
	t.Helper()
	logs := &lockedBuffer{}
	src := NewDirSource(dir, "node-a", slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	sink := newRecordingSink()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, sink) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	sink.waitSynced(t)
	return src, sink, logs
}

// eventually polls cond, for state the sink does not see (logs, Errors).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

func waitLog(t *testing.T, logs *lockedBuffer, want string) {
	t.Helper()
	eventually(t, fmt.Sprintf("a log line containing %q", want), func() bool { return strings.Contains(logs.String(), want) })
}

func waitErrors(t *testing.T, src *DirSource, n int) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d errors", n), func() bool { return len(src.Errors()) == n })
}
