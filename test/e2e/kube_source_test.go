package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/source"
	"github.com/kpproxy/kp/test/apiserver"
	"github.com/kpproxy/kp/test/logbuf"
	"github.com/kpproxy/kp/test/netns"
)

// syncBuffer is a log sink written from several goroutines.
type syncBuffer = logbuf.Buffer

// TestKubeSourceStreamsTheInitialListAndKeepsNoCache runs the kube source
// in this process against the real API server: the initial lists arrive
// streamed (watch-list), every object reaches the tracker, and later
// changes and deletions follow, without an informer cache (the source keeps
// keys and resourceVersions; the tracker its own compact form).
func TestKubeSourceStreamsTheInitialListAndKeepsNoCache(t *testing.T) {
	netns.Require(t)
	srv := apiserver.Start(t, apiserver.Options{})
	api := srv.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := api.CoreV1().Nodes().Create(ctx, Node(nodeName, []string{"192.0.2.1"}, []string{"10.244.0.0/24"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ready := true
	create := func(name string, ip string) {
		t.Helper()
		svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: v1.ServiceSpec{Ports: []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80}}}}
		if _, err := api.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		sl := &discovery.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-1", Namespace: "default",
				Labels: map[string]string{discovery.LabelServiceName: name}},
			AddressType: discovery.AddressTypeIPv4,
			Ports:       []discovery.EndpointPort{{Name: ptr("http"), Protocol: ptr(v1.ProtocolTCP), Port: ptr(int32(8080))}},
			Endpoints:   []discovery.Endpoint{{Addresses: []string{ip}, Conditions: discovery.EndpointConditions{Ready: &ready}}},
		}
		if _, err := api.DiscoveryV1().EndpointSlices("default").Create(ctx, sl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 20 {
		create(fmt.Sprintf("svc%d", i), fmt.Sprintf("10.244.0.%d", i+10))
	}

	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	tracker := proxy.NewChangeTracker(proxy.ChangeTrackerOptions{NodeName: nodeName, Sources: 1})
	client, err := source.KubeClientFor(srv.Instance(0).Config(srv.AdminToken()))
	if err != nil {
		t.Fatal(err)
	}
	src := source.NewKubeSource(client, nodeName, 0, log)
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(runCtx, tracker) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	if err := tracker.WaitForSync(ctx); err != nil {
		t.Fatalf("no sync: %v\n%s", err, logs)
	}
	endpoints := func() (services, eps int) {
		s := tracker.Snapshot()
		for name := range s.Services {
			if name.Namespace == "default" && strings.HasPrefix(name.Name, "svc") {
				services++
				eps += len(s.Endpoints[name])
			}
		}
		return services, eps
	}
	if n, e := endpoints(); n != 20 || e != 20 {
		t.Errorf("after the initial lists: %d Services with %d endpoints, want 20 and 20", n, e)
	}
	for _, kind := range []string{"Service", "EndpointSlice", "Node"} {
		// The source logs to this test's own slog text handler (above),
		// not kp's klog text: key=value, strings unquoted.
		if !regexp.MustCompile(fmt.Sprintf(`msg="initial list".* kind=%s objects=\d+ streamed=true`, kind)).MatchString(logs.String()) {
			t.Errorf("the initial list of %ss was not streamed:\n%s", kind, logs)
		}
	}

	// Changes after the lists: one more Service, one gone.
	create("svc20", "10.244.0.30")
	if err := api.CoreV1().Services("default").Delete(ctx, "svc0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, e := endpoints()
		if n == 20 && e == 20 && tracker.Snapshot().Services[proxy.ServicePortName{
			NamespacedName: types.NamespacedName{Namespace: "default", Name: "svc20"}, Port: "http", Protocol: v1.ProtocolTCP}] != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a create and a delete: %d Services with %d endpoints, want 20 and 20, svc20 among them", n, e)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
