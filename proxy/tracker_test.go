package proxy

import (
	"bytes"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kpproxy/kp/proxy/proxytest"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

var trackerStart = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func newTestTracker(t *testing.T, log *slog.Logger) (*ChangeTracker, *atomic.Int32) {
	t.Helper()
	var notified atomic.Int32
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tr := NewChangeTracker(ChangeTrackerOptions{
		NodeName: "node-a",
		Log:      log,
		OnChange: func() { notified.Add(1) },
		Sources:  1,
		Clock:    clocktesting.NewFakePassiveClock(trackerStart),
	})
	return tr, &notified
}

// stateEndpoints renders a State as service port → "ip:port" endpoints.
func stateEndpoints(s *State) map[ServicePortName][]string {
	out := make(map[ServicePortName][]string)
	for name := range s.Services {
		out[name] = []string{}
		for _, e := range s.Endpoints[name] {
			out[name] = append(out[name], e.String())
		}
	}
	return out
}

func sortedNames(m map[ServicePortName]struct{}) []ServicePortName {
	names := slices.Collect(maps.Keys(m))
	slices.SortFunc(names, func(a, b ServicePortName) int { return strings.Compare(a.String(), b.String()) })
	return names
}

func TestChangeTracker(t *testing.T) {
	web := spName("ns", "web", "http", v1.ProtocolTCP)
	api := spName("ns", "api", "http", v1.ProtocolTCP)
	apiService := func(muts ...func(*v1.Service)) *v1.Service {
		return proxytest.Service("ns", "api", append([]func(*v1.Service){func(s *v1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.20", []string{"10.96.0.20"}
		}}, muts...)...)
	}
	withRV := func(rv string) func(*v1.Service) { return func(s *v1.Service) { s.ResourceVersion = rv } }
	// Every case starts from web (one endpoint) and api (no endpoints),
	// snapshotted once; then applies change and snapshots again.
	tests := []struct {
		name          string
		change        func(s Sink)
		wantNotified  bool
		wantChanged   []ServicePortName
		wantEndpoints map[ServicePortName][]string
	}{
		{
			name: "update that converts to the same service port is ignored",
			change: func(s Sink) {
				proxytest.AddService(s, proxytest.Service("ns", "web", withRV("2"), func(s *v1.Service) {
					s.Annotations = map[string]string{"irrelevant": "yes"}
				}))
			},
			wantEndpoints: map[ServicePortName][]string{web: {"10.0.0.1:8080"}, api: {}},
		},
		{
			name: "slice rewritten with the same endpoints is ignored",
			change: func(s Sink) {
				proxytest.AddSlice(s, proxytest.Slice("ns", "web-a", "web", []string{"10.0.0.1"}, func(sl *discovery.EndpointSlice) {
					sl.ResourceVersion = "2"
					sl.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: trackerStart.Add(time.Minute).Format(time.RFC3339)}
				}))
			},
			wantEndpoints: map[ServicePortName][]string{web: {"10.0.0.1:8080"}, api: {}},
		},
		{
			name: "service changed and changed back is not in Changed",
			change: func(s Sink) {
				proxytest.AddService(s, proxytest.Service("ns", "web", withRV("2"), func(s *v1.Service) { s.Spec.Ports[0].Port = 81 }))
				proxytest.AddService(s, proxytest.Service("ns", "web", withRV("3")))
			},
			wantNotified:  true,
			wantEndpoints: map[ServicePortName][]string{web: {"10.0.0.1:8080"}, api: {}},
		},
		{
			name: "modified service port is in Changed",
			change: func(s Sink) {
				proxytest.AddService(s, proxytest.Service("ns", "web", withRV("2"), func(s *v1.Service) { s.Spec.Ports[0].Port = 81 }))
			},
			wantNotified:  true,
			wantChanged:   []ServicePortName{web},
			wantEndpoints: map[ServicePortName][]string{web: {"10.0.0.1:8080"}, api: {}},
		},
		{
			name:          "deleted service is in Changed and gone",
			change:        func(s Sink) { s.OnService("ns", "web", nil) },
			wantNotified:  true,
			wantChanged:   []ServicePortName{web},
			wantEndpoints: map[ServicePortName][]string{api: {}},
		},
		{
			name: "renamed port replaces the old service port",
			change: func(s Sink) {
				proxytest.AddService(s, proxytest.Service("ns", "web", withRV("2"), func(s *v1.Service) { s.Spec.Ports[0].Name = "web" }))
			},
			wantNotified: true,
			wantChanged:  []ServicePortName{web, spName("ns", "web", "web", v1.ProtocolTCP)},
			wantEndpoints: map[ServicePortName][]string{
				spName("ns", "web", "web", v1.ProtocolTCP): {}, api: {},
			},
		},
		{
			// The snapshot holds the first name: each change must not
			// take the one before it for what was published.
			name: "port renamed twice replaces the published one",
			change: func(s Sink) {
				proxytest.AddService(s, proxytest.Service("ns", "web", withRV("2"), func(s *v1.Service) { s.Spec.Ports[0].Name = "web" }))
				proxytest.AddService(s, proxytest.Service("ns", "web", withRV("3"), func(s *v1.Service) { s.Spec.Ports[0].Name = "www" }))
			},
			wantNotified: true,
			wantChanged:  []ServicePortName{web, spName("ns", "web", "www", v1.ProtocolTCP)},
			wantEndpoints: map[ServicePortName][]string{
				spName("ns", "web", "www", v1.ProtocolTCP): {}, api: {},
			},
		},
		{
			name: "port renamed after an update that changed nothing",
			change: func(s Sink) {
				proxytest.AddService(s, proxytest.Service("ns", "web", withRV("2"), func(s *v1.Service) {
					s.Annotations = map[string]string{"irrelevant": "yes"}
				}))
				proxytest.AddService(s, proxytest.Service("ns", "web", withRV("3"), func(s *v1.Service) { s.Spec.Ports[0].Name = "web" }))
			},
			wantNotified: true,
			wantChanged:  []ServicePortName{web, spName("ns", "web", "web", v1.ProtocolTCP)},
			wantEndpoints: map[ServicePortName][]string{
				spName("ns", "web", "web", v1.ProtocolTCP): {}, api: {},
			},
		},
		{
			name: "service deleted and created again with another port",
			change: func(s Sink) {
				s.OnService("ns", "web", nil)
				proxytest.AddService(s, proxytest.Service("ns", "web", withRV("3"), func(s *v1.Service) { s.Spec.Ports[0].Name = "web" }))
			},
			wantNotified: true,
			wantChanged:  []ServicePortName{web, spName("ns", "web", "web", v1.ProtocolTCP)},
			wantEndpoints: map[ServicePortName][]string{
				spName("ns", "web", "web", v1.ProtocolTCP): {}, api: {},
			},
		},
		{
			name: "slice replaced by another of the same service",
			change: func(s Sink) {
				proxytest.AddSlice(s, proxytest.Slice("ns", "web-b", "web", []string{"10.0.0.2"}))
				s.OnEndpointSlice("ns", "web-a", nil)
			},
			wantNotified:  true,
			wantChanged:   []ServicePortName{web},
			wantEndpoints: map[ServicePortName][]string{web: {"10.0.0.2:8080"}, api: {}},
		},
		{
			name: "slice moved to another service changes both",
			change: func(s Sink) {
				proxytest.AddSlice(s, proxytest.Slice("ns", "web-a", "api", []string{"10.0.0.1"}, func(sl *discovery.EndpointSlice) { sl.ResourceVersion = "2" }))
			},
			wantNotified:  true,
			wantChanged:   []ServicePortName{api, web},
			wantEndpoints: map[ServicePortName][]string{web: {}, api: {"10.0.0.1:8080"}},
		},
		{
			name: "endpoint in two slices is listed once",
			change: func(s Sink) {
				proxytest.AddSlice(s, proxytest.Slice("ns", "web-b", "web", []string{"10.0.0.2", "10.0.0.1"}))
			},
			wantNotified:  true,
			wantChanged:   []ServicePortName{web},
			wantEndpoints: map[ServicePortName][]string{web: {"10.0.0.1:8080", "10.0.0.2:8080"}, api: {}},
		},
		{
			name: "slice for a service not yet known is kept for it",
			change: func(s Sink) {
				proxytest.AddSlice(s, proxytest.Slice("ns", "db-a", "db", []string{"10.0.0.9"}))
				proxytest.AddService(s, proxytest.Service("ns", "db", func(s *v1.Service) { s.Spec.ClusterIPs = []string{"10.96.0.30"} }))
			},
			wantNotified: true,
			wantChanged:  []ServicePortName{spName("ns", "db", "http", v1.ProtocolTCP)},
			wantEndpoints: map[ServicePortName][]string{
				web: {"10.0.0.1:8080"}, api: {}, spName("ns", "db", "http", v1.ProtocolTCP): {"10.0.0.9:8080"},
			},
		},
		{
			name: "bad objects are skipped while the others stay",
			change: func(s Sink) {
				proxytest.AddService(s, apiService(withRV("2"), func(s *v1.Service) { s.Spec.ClusterIPs = []string{"bogus"} }))
				proxytest.AddService(s, proxytest.Service("ns", "db", func(s *v1.Service) { s.Spec.Ports[0].Protocol = "ICMP" }))
				proxytest.AddSlice(s, proxytest.Slice("ns", "web-b", "web", []string{"10.0.0.2", "not-an-ip"}))
			},
			wantNotified:  true,
			wantChanged:   []ServicePortName{api, web},
			wantEndpoints: map[ServicePortName][]string{web: {"10.0.0.1:8080", "10.0.0.2:8080"}},
		},
		{
			name: "service becoming headless is removed",
			change: func(s Sink) {
				proxytest.AddService(s, proxytest.Service("ns", "web", withRV("2"), func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", nil }))
			},
			wantNotified:  true,
			wantChanged:   []ServicePortName{web},
			wantEndpoints: map[ServicePortName][]string{api: {}},
		},
		{
			name:          "deleted slice removes its endpoints",
			change:        func(s Sink) { s.OnEndpointSlice("ns", "web-a", nil) },
			wantNotified:  true,
			wantChanged:   []ServicePortName{web},
			wantEndpoints: map[ServicePortName][]string{web: {}, api: {}},
		},
		{
			name:          "deleting an unknown object is ignored",
			change:        func(s Sink) { s.OnService("ns", "nope", nil); s.OnEndpointSlice("ns", "nope", nil) },
			wantEndpoints: map[ServicePortName][]string{web: {"10.0.0.1:8080"}, api: {}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr, notified := newTestTracker(t, nil)
			proxytest.AddService(tr, proxytest.Service("ns", "web", withRV("1")))
			proxytest.AddService(tr, apiService(withRV("1")))
			proxytest.AddSlice(tr, proxytest.Slice("ns", "web-a", "web", []string{"10.0.0.1"}, func(sl *discovery.EndpointSlice) { sl.ResourceVersion = "1" }))
			first := tr.Snapshot()
			firstEndpoints := stateEndpoints(first)
			notified.Store(0)

			tt.change(tr)
			if got := notified.Load() > 0; got != tt.wantNotified {
				t.Errorf("OnChange called: %v, want %v", got, tt.wantNotified)
			}
			s := tr.Snapshot()
			if s.Generation != first.Generation+1 {
				t.Errorf("generation %d after %d", s.Generation, first.Generation)
			}
			if got := sortedNames(s.Changed); !slices.Equal(got, tt.wantChanged) {
				t.Errorf("Changed = %v, want %v", got, tt.wantChanged)
			}
			if got := stateEndpoints(s); !maps.EqualFunc(got, tt.wantEndpoints, slices.Equal) {
				t.Errorf("state = %v, want %v", got, tt.wantEndpoints)
			}
			for name, sp := range s.Services {
				if _, changed := s.Changed[name]; !changed && first.Services[name] != sp {
					t.Errorf("unchanged %s is a new *ServicePort, want the previous one shared", name)
				}
			}
			if got := stateEndpoints(first); !maps.EqualFunc(got, firstEndpoints, slices.Equal) {
				t.Errorf("previous State was modified: %v, was %v", got, firstEndpoints)
			}
		})
	}
}

func TestFirstSnapshotHasEveryServicePortChanged(t *testing.T) {
	tr, _ := newTestTracker(t, nil)
	proxytest.AddService(tr, proxytest.Service("ns", "web"))
	proxytest.AddSlice(tr, proxytest.Slice("ns", "web-a", "web", []string{"10.0.0.1"}))
	s := tr.Snapshot()
	web := spName("ns", "web", "http", v1.ProtocolTCP)
	if s.Generation != 1 || !slices.Equal(sortedNames(s.Changed), []ServicePortName{web}) || !s.NodeChanged {
		t.Errorf("first snapshot: generation %d, changed %v, nodeChanged %v", s.Generation, sortedNames(s.Changed), s.NodeChanged)
	}
	if s.Node.Name != "node-a" {
		t.Errorf("node name %q before any Node arrived, want node-a", s.Node.Name)
	}
	next := tr.Snapshot()
	if len(next.Changed) != 0 || next.NodeChanged || len(next.Services) != 1 {
		t.Errorf("snapshot with no changes: changed %v, nodeChanged %v, %d services", next.Changed, next.NodeChanged, len(next.Services))
	}
}

// A snapshot taken while a batch runs waits for it: it holds the batch's
// Service and its endpoints, never the Service alone.
func TestSnapshotHoldsAllOfABatchOrNone(t *testing.T) {
	tr, _ := newTestTracker(t, nil)
	web := spName("ns", "web", "http", v1.ProtocolTCP)
	got := make(chan *State, 1)
	tr.Batch(func() {
		proxytest.AddService(tr, proxytest.Service("ns", "web"))
		go func() { got <- tr.Snapshot() }()
		// Time for the snapshot to run, were it not held.
		time.Sleep(100 * time.Millisecond)
		proxytest.AddSlice(tr, proxytest.Slice("ns", "web-a", "web", []string{"10.0.0.1"}))
	})
	s := <-got
	if eps := stateEndpoints(s)[web]; len(eps) != 1 {
		t.Errorf("the snapshot taken during the batch has %s with endpoints %v, want the batch's one", web, eps)
	}
}

func TestTriggerTimes(t *testing.T) {
	tr, _ := newTestTracker(t, nil)
	web := spName("ns", "web", "http", v1.ProtocolTCP)
	withTrigger := func(at time.Time) func(*discovery.EndpointSlice) {
		return func(sl *discovery.EndpointSlice) {
			sl.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: at.Format(time.RFC3339)}
		}
	}
	proxytest.AddService(tr, proxytest.Service("ns", "web"))
	proxytest.AddSlice(tr, proxytest.Slice("ns", "web-a", "web", []string{"10.0.0.1"}, withTrigger(trackerStart.Add(-time.Hour))))
	if s := tr.Snapshot(); len(s.TriggerTimes) != 0 {
		t.Errorf("trigger times older than the tracker are kept: %v", s.TriggerTimes)
	}

	proxytest.AddSlice(tr, proxytest.Slice("ns", "web-a", "web", []string{"10.0.0.2"}, withTrigger(trackerStart.Add(2*time.Second))))
	proxytest.AddSlice(tr, proxytest.Slice("ns", "web-b", "web", []string{"10.0.0.3"}, withTrigger(trackerStart.Add(time.Second))))
	s := tr.Snapshot()
	if got, want := s.TriggerTimes[web], trackerStart.Add(time.Second); !got.Equal(want) {
		t.Errorf("trigger time %v, want the oldest pending %v", got, want)
	}
	if s := tr.Snapshot(); len(s.TriggerTimes) != 0 {
		t.Errorf("trigger times repeated in the next snapshot: %v", s.TriggerTimes)
	}
}

func TestNodeChanges(t *testing.T) {
	node := func(muts ...func(*v1.Node)) *v1.Node {
		n := &v1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{v1.LabelTopologyZone: "zone-a"}},
			Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
				{Type: v1.NodeHostName, Address: "node-a"},
				{Type: v1.NodeExternalIP, Address: "203.0.113.5"},
				{Type: v1.NodeInternalIP, Address: "192.168.0.5"},
				{Type: v1.NodeInternalIP, Address: "fd00::5"},
			}},
		}
		for _, m := range muts {
			m(n)
		}
		return n
	}
	tr, notified := newTestTracker(t, nil)
	tr.OnNode(node())
	s := tr.Snapshot()
	if want := proxytest.Addrs("192.168.0.5", "fd00::5", "203.0.113.5"); !s.NodeChanged || !slices.Equal(s.Node.IPs, want) || s.Node.Zone() != "zone-a" {
		t.Fatalf("node = %+v (changed %v), want IPs %v and zone-a", s.Node, s.NodeChanged, want)
	}
	if ip, _ := s.Node.PrimaryIP(IPv6); ip != proxytest.Addrs("fd00::5")[0] {
		t.Errorf("primary IPv6 = %v", ip)
	}

	notified.Store(0)
	tr.OnNode(node(func(n *v1.Node) { n.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady}} }))
	if notified.Load() != 0 || tr.Snapshot().NodeChanged {
		t.Error("a Node status change that does not touch addresses or labels counts as a change")
	}
	tr.OnNode(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}})
	if notified.Load() != 0 {
		t.Error("another node's update counts as a change")
	}
	tr.OnNode(node(func(n *v1.Node) { n.Labels[v1.LabelTopologyZone] = "zone-b" }))
	if s := tr.Snapshot(); notified.Load() != 1 || !s.NodeChanged || s.Node.Zone() != "zone-b" {
		t.Errorf("zone change: notified %d, nodeChanged %v, zone %q", notified.Load(), s.NodeChanged, s.Node.Zone())
	}
}

func TestSyncedAfterEverySource(t *testing.T) {
	var notified atomic.Int32
	tr := NewChangeTracker(ChangeTrackerOptions{Sources: 2, OnChange: func() { notified.Add(1) }})
	if tr.Synced() {
		t.Fatal("synced before any source")
	}
	tr.OnSynced()
	if tr.Synced() || notified.Load() != 0 {
		t.Fatal("synced after one source of two")
	}
	tr.OnSynced()
	if !tr.Synced() || notified.Load() != 1 {
		t.Fatalf("synced %v, notified %d after both sources", tr.Synced(), notified.Load())
	}
}

func TestValidationErrorsAreLoggedOncePerObjectVersion(t *testing.T) {
	var buf bytes.Buffer
	tr, _ := newTestTracker(t, slog.New(slog.NewTextHandler(&buf, nil)))
	bad := func(rv string) *v1.Service {
		return proxytest.Service("ns", "web", func(s *v1.Service) { s.ResourceVersion = rv; s.Spec.Ports[0].Port = 0 })
	}
	proxytest.AddService(tr, bad("1"))
	proxytest.AddService(tr, bad("1")) // informer resync
	tr.Snapshot()
	tr.Snapshot()
	if n := strings.Count(buf.String(), "spec.ports[0].port"); n != 1 {
		t.Fatalf("logged %d times, want once:\n%s", n, buf.String())
	}
	for _, want := range []string{"kind=Service", "object=ns/web", "field=spec.ports[0].port", "error="} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, buf.String())
		}
	}
	proxytest.AddService(tr, bad("2"))
	if n := strings.Count(buf.String(), "spec.ports[0].port"); n != 2 {
		t.Errorf("a new version logged %d times in all, want 2", n)
	}

	// Manifests have no resourceVersion: the same errors again are not news.
	buf.Reset()
	sl := proxytest.Slice("ns", "web-a", "web", []string{"nope"})
	proxytest.AddSlice(tr, sl)
	proxytest.AddSlice(tr, sl)
	if n := strings.Count(buf.String(), "endpoints[0].addresses[0]"); n != 1 {
		t.Errorf("slice without resourceVersion logged %d times, want once:\n%s", n, buf.String())
	}
}

// BenchmarkSnapshotAfterOneChange measures a sync's core cost with 30,000
// Services when one of them changed: it must not grow with re-merging the
// world (only the map copies are proportional to the Service count).
func BenchmarkSnapshotAfterOneChange(b *testing.B) {
	tr := NewChangeTracker(ChangeTrackerOptions{})
	const n = 30000
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		ip := fmt.Sprintf("10.%d.%d.%d", 96+i/65536, i/256%256, i%256)
		proxytest.AddService(tr, proxytest.Service("ns", name, func(s *v1.Service) { s.Spec.ClusterIPs = []string{ip} }))
		proxytest.AddSlice(tr, proxytest.Slice("ns", name+"-a", name, []string{"10.200.0.1", "10.200.0.2", "10.200.0.3"}))
	}
	tr.Snapshot()
	b.ResetTimer()
	for i := range b.N {
		ips := []string{"10.200.0.1", fmt.Sprintf("10.201.%d.%d", i/256%256, i%256)}
		proxytest.AddSlice(tr, proxytest.Slice("ns", "svc-7-a", "svc-7", ips))
		if s := tr.Snapshot(); len(s.Changed) != 1 || len(s.Services) != n {
			b.Fatalf("changed %d, services %d", len(s.Changed), len(s.Services))
		}
	}
}

func TestNodeAddressErrorNamesTheNode(t *testing.T) {
	_, errs := NodeFrom("node-a", &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
		Status:     v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.168.0.300"}}},
	})
	if len(errs) != 1 || !strings.HasPrefix(errs[0].Error(), "Node node-a: status.addresses[0].address: ") {
		t.Errorf("errors = %v", errs)
	}
}

// Upstream's feature gate AllowServiceExternalIPs=false: no externalIPs are
// proxied, and the Node's pod CIDRs are part of the Node kp sees.
func TestTrackerIgnoresExternalIPsWhenAsked(t *testing.T) {
	for _, ignore := range []bool{false, true} {
		tr := NewChangeTracker(ChangeTrackerOptions{NodeName: "node-a", Log: slog.New(slog.DiscardHandler), Sources: 1,
			IgnoreExternalIPs: ignore})
		proxytest.AddService(tr, proxytest.Service("ns", "web", func(s *v1.Service) {
			s.Spec.ExternalIPs = []string{"192.0.2.10"}
		}))
		tr.OnNode(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Spec: v1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24"}}})
		tr.OnSynced()
		s := tr.Snapshot()
		for name, sp := range s.Services {
			if got := len(sp.ExternalIPs); (got == 0) != ignore {
				t.Errorf("IgnoreExternalIPs %t: %s has external IPs %v", ignore, name, sp.ExternalIPs)
			}
		}
		if len(s.Services) == 0 || fmt.Sprint(s.Node.PodCIDRs) != "[10.244.1.0/24]" {
			t.Errorf("services %v, node %+v", s.Services, s.Node)
		}
	}
}
