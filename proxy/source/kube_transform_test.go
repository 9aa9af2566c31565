package source

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/kpproxy/kp/internal/kubeclient/fromclientset"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/server"
)

// listedService is Service i as an API server lists it: with the
// metadata, selector and managed fields kp does not read, besides a
// LoadBalancer's status and source ranges, which it does.
func listedService(i int) *v1.Service {
	name := fmt.Sprintf("svc%d", i)
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "bench", UID: types.UID(fmt.Sprintf("6b1c2f0e-0000-4000-8000-%012d", i)),
			ResourceVersion: fmt.Sprint(1000 + i), CreationTimestamp: metav1.Now(),
			Labels:      map[string]string{"app": name, "kp-bench": "true"},
			Annotations: map[string]string{v1.AnnotationLoadBalancerSourceRangesKey: "10.0.0.0/8", "team": "bench"},
			ManagedFields: []metav1.ManagedFieldsEntry{{
				Manager: "kp-bench", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1",
				Time: ptr.To(metav1.Now()), FieldsType: "FieldsV1",
				FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:labels":{".":{},"f:app":{},"f:kp-bench":{}}},"f:spec":{"f:internalTrafficPolicy":{},"f:ports":{".":{},"k:{\"port\":80,\"protocol\":\"TCP\"}":{".":{},"f:name":{},"f:port":{},"f:protocol":{},"f:targetPort":{}}},"f:selector":{},"f:sessionAffinity":{},"f:type":{}}}`)},
			}},
		},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeLoadBalancer,
			Selector:   map[string]string{"app": name},
			ClusterIP:  fmt.Sprintf("10.96.%d.%d", i/250, i%250+1),
			ClusterIPs: []string{fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)},
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP,
				TargetPort: intstr.FromInt32(8080), NodePort: int32(30000 + i%2000)}},
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol}, IPFamilyPolicy: ptr.To(v1.IPFamilyPolicySingleStack),
			SessionAffinity: v1.ServiceAffinityNone, InternalTrafficPolicy: ptr.To(v1.ServiceInternalTrafficPolicyCluster),
			ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyCluster,
		},
		Status: v1.ServiceStatus{LoadBalancer: v1.LoadBalancerStatus{Ingress: []v1.LoadBalancerIngress{
			{IP: fmt.Sprintf("192.0.2.%d", i%250+1)}}}},
	}
}

// listedSlice is Service i's EndpointSlice of n endpoints as the
// EndpointSlice controller writes it.
func listedSlice(i, n int) *discovery.EndpointSlice {
	name := fmt.Sprintf("svc%d", i)
	s := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: name + "-abcde", Namespace: "bench", UID: types.UID(fmt.Sprintf("7c2d3f1e-0000-4000-8000-%012d", i)),
			ResourceVersion: fmt.Sprint(50000 + i), CreationTimestamp: metav1.Now(), GenerateName: name + "-",
			Labels: map[string]string{discovery.LabelServiceName: name, discovery.LabelManagedBy: "endpointslice-controller.k8s.io",
				"app": name},
			Annotations: map[string]string{v1.EndpointsLastChangeTriggerTime: "2026-11-24T20:00:00Z"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: name,
				UID: types.UID(fmt.Sprintf("6b1c2f0e-0000-4000-8000-%012d", i)), Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
			ManagedFields: []metav1.ManagedFieldsEntry{{
				Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "discovery.k8s.io/v1",
				Time: ptr.To(metav1.Now()), FieldsType: "FieldsV1",
				FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:addressType":{},"f:endpoints":{},"f:metadata":{"f:annotations":{".":{},"f:endpoints.kubernetes.io/last-change-trigger-time":{}},"f:generateName":{},"f:labels":{".":{},"f:app":{},"f:endpointslice.kubernetes.io/managed-by":{},"f:kubernetes.io/service-name":{}},"f:ownerReferences":{".":{},"k:{\"uid\":\"6b1c2f0e\"}":{}}},"f:ports":{}}`)},
			}},
		},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(8080)), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
	for j := range n {
		pod := fmt.Sprintf("%s-7d9f8c6b5-%05d", name, j)
		s.Endpoints = append(s.Endpoints, discovery.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 100+i/250, i%250, j+1)},
			Conditions: discovery.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(fmt.Sprintf("node-%d", j%5)), Zone: ptr.To("zone-a"),
			TargetRef: &v1.ObjectReference{Kind: "Pod", Namespace: "bench", Name: pod,
				UID: types.UID(fmt.Sprintf("8d3e4f2a-0000-4000-8000-%06d%06d", i, j))},
		})
	}
	return s
}

// TestTransformKeepsWhatKpReads: a compacted Service, EndpointSlice and
// Node convert to exactly what the listed ones do.
func TestTransformKeepsWhatKpReads(t *testing.T) {
	svc := listedService(7)
	svc.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	svc.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To(int32(60))}}
	svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	svc.Spec.HealthCheckNodePort = 32000
	svc.Spec.TrafficDistribution = ptr.To("PreferClose")
	svc.Spec.ExternalIPs = []string{"192.0.2.200"}
	svc.Spec.LoadBalancerSourceRanges = nil // the annotation's ranges apply
	want, err := proxy.ServicePortsFromService(svc)
	if err != nil || len(want) != 1 {
		t.Fatalf("listed Service: %v, %v", want, err)
	}
	got, err := proxy.ServicePortsFromService(compactService(svc))
	if err != nil || !proxy.PortsEqual(got, want) {
		t.Errorf("compacted Service converts to %+v (%v), want %+v", got[0], err, want[0])
	}

	slice := listedSlice(7, 3)
	slice.Endpoints[1].Hints = &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: "zone-a"}}}
	slice.Endpoints[2].Addresses = append(slice.Endpoints[2].Addresses, "10.99.0.1")
	wantInfo, errs := proxy.ParseEndpointSlice(slice)
	gotInfo, gerrs := proxy.ParseEndpointSlice(compactEndpointSlice(slice))
	if len(errs)+len(gerrs) > 0 || !wantInfo.Equal(gotInfo) || !gotInfo.TriggerTime.Equal(wantInfo.TriggerTime) {
		t.Errorf("compacted slice parses to %+v (%v), want %+v (%v)", gotInfo, gerrs, wantInfo, errs)
	}
	for _, drop := range []string{"app", discovery.LabelManagedBy} {
		if _, ok := compactEndpointSlice(slice).Labels[drop]; ok {
			t.Errorf("compacted slice keeps label %s", drop)
		}
	}

	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{v1.LabelTopologyZone: "zone-a", "kubernetes.io/os": "linux"},
			Annotations: map[string]string{proxy.AnnotationProxyMode: "iptables", "node.alpha.kubernetes.io/ttl": "0"}},
		Status: v1.NodeStatus{
			Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.0.2.1"}, {Type: v1.NodeExternalIP, Address: "2001:db8::1"}},
			Images:    []v1.ContainerImage{{Names: []string{"registry.k8s.io/pause:3.10"}, SizeBytes: 320000}},
		},
	}
	wantNode, _ := proxy.NodeFrom("node-a", node)
	gotNode, _ := proxy.NodeFrom("node-a", compactNode(node))
	if !reflect.DeepEqual(gotNode.IPs, wantNode.IPs) || gotNode.Zone() != wantNode.Zone() || gotNode.ProxyMode != "iptables" ||
		len(compactNode(node).Status.Images) != 0 {
		t.Errorf("compacted Node converts to %+v, want the addresses, zone and requested mode of %+v", gotNode, wantNode)
	}

	// /healthz's node eligibility reads the autoscaler's taint and the
	// deletion timestamp from the compacted Node.
	node.Spec.Taints = []v1.Taint{{Key: "other", Effect: v1.TaintEffectNoSchedule}, {Key: proxy.ToBeDeletedTaint, Value: "1", Effect: v1.TaintEffectNoSchedule}}
	h := server.NewHealth(time.Minute, clocktesting.NewFakeClock(time.Now()))
	h.SyncNode(compactNode(node))
	if _, _, _, eligible := h.Status(); eligible {
		t.Errorf("a Node tainted %s is eligible once compacted", proxy.ToBeDeletedTaint)
	}
	if got := compactNode(node).Spec.Taints; len(got) != 1 {
		t.Errorf("compacted Node keeps taints %v, want only %s", got, proxy.ToBeDeletedTaint)
	}
	now := metav1.Now()
	node.Spec.Taints, node.DeletionTimestamp = nil, &now
	h.SyncNode(compactNode(node))
	if _, _, _, eligible := h.Status(); eligible {
		t.Error("a Node being deleted is eligible once compacted")
	}
}

var (
	benchInformerServices = flag.Int("bench.informer-services", 10000, "Services (of 10 endpoints) in BenchmarkInformerCacheHeap")
	benchHeapProfile      = flag.String("bench.heap-profile", "", "write BenchmarkInformerCacheHeap's heap profiles to this prefix")
)

// BenchmarkInformerCacheHeap measures what the kube source and the change
// tracker keep for -bench.informer-services Services of 10 endpoints each
// (one EndpointSlice per Service) from a fake API server: the heap after
// the source synced and the tracker made its snapshot, less the heap
// before (the fake's own copies of the objects), with the transforms
// (compact) and without (as-listed). Since the source keeps no informer
// cache, the two are the same: the transforms only shape a streamed list
// the reflector holds, which the fake does not serve.
func BenchmarkInformerCacheHeap(b *testing.B) {
	for _, tc := range []struct {
		name      string
		transform bool
	}{{"as-listed", false}, {"compact", true}} {
		b.Run(tc.name, func(b *testing.B) {
			var mib float64
			for range b.N {
				mib = informerHeap(b, *benchInformerServices, tc.transform, tc.name)
			}
			b.ReportMetric(mib, "MiB-retained")
		})
	}
}

func informerHeap(b *testing.B, n int, transform bool, name string) float64 {
	b.StopTimer()
	defer b.StartTimer()
	// The simple fake: the field-managing one takes minutes to take
	// 20,000 objects.
	client := fake.NewSimpleClientset() //nolint:staticcheck // see above
	for i := range n {
		if err := client.Tracker().Add(listedService(i)); err != nil {
			b.Fatal(err)
		}
		if err := client.Tracker().Add(listedSlice(i, 10)); err != nil {
			b.Fatal(err)
		}
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b.StartTimer()
	src := NewKubeSource(fromclientset.New(client), "node-a", 0, slog.New(slog.DiscardHandler))
	if !transform {
		src.transform = nil
	}
	tracker := proxy.NewChangeTracker(proxy.ChangeTrackerOptions{NodeName: "node-a", Sources: 1})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, tracker) }()
	wait, stop := context.WithTimeout(ctx, 5*time.Minute)
	defer stop()
	if err := tracker.WaitForSync(wait); err != nil {
		b.Fatal(err)
	}
	st := tracker.Snapshot()
	b.StopTimer()
	if len(st.Services) != n {
		b.Fatalf("snapshot has %d service ports, want %d", len(st.Services), n)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if *benchHeapProfile != "" {
		f, err := os.Create(*benchHeapProfile + "-" + strings.ReplaceAll(name, "/", "-") + ".pprof")
		if err == nil {
			_ = pprof.Lookup("heap").WriteTo(f, 0)
			f.Close()
		}
	}
	cancel()
	<-done
	runtime.KeepAlive(client)
	runtime.KeepAlive(st)
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / (1 << 20)
}
