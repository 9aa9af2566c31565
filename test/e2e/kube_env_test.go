package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/kpproxy/kp/test/apiserver"
	"github.com/kpproxy/kp/test/netns"
)

// fieldManager owns what the tests write through server-side apply.
const fieldManager = "kp-e2e"

// kubeEnv is an env whose kp reads a real API server (test/apiserver)
// instead of a folder. The test writes Services and EndpointSlices through
// client-go, as the endpointslice controller would (there is none: no
// controller-manager runs).
type kubeEnv struct {
	*env
	srv *apiserver.Server
	api kubernetes.Interface // admin client of the instance that stays up
}

// newKubeEnv builds an API server and a world connected to it, and creates
// the node's Node object (zone-a) and the e2e namespace. kp is not started.
// The test runs in parallel with others.
func newKubeEnv(t *testing.T, m mode, pods int, opts apiserver.Options) *kubeEnv {
	t.Helper()
	netns.Require(t)
	skipUnselected(t, m)
	apiserver.Bin(t, apiserver.KubeAPIServer) // skip before t.Parallel waits
	t.Parallel()
	vmAlone(t)
	return newKubeEnvSerial(t, m, pods, opts)
}

// newKubeEnvSerial is newKubeEnv for a test that must not run in parallel.
func newKubeEnvSerial(t *testing.T, m mode, pods int, opts apiserver.Options) *kubeEnv {
	t.Helper()
	srv := apiserver.Start(t, opts)
	e := newEnvSerial(t, m, pods)
	// The pods' range routes back through the node, so pods reach the API
	// server through the kubernetes Service as they would in a cluster.
	srv.Connect(e.w.Node(), e.w.PodCIDR())
	k := &kubeEnv{env: e, srv: srv, api: srv.Client()}
	k.source = []string{"--kubeconfig", srv.Kubeconfig(0, srv.AdminToken())}

	node := Node(nodeName,
		[]string{e.w.NodeIP().String(), e.w.NodeIP6().String()},
		[]string{e.w.PodCIDR().String(), e.w.PodCIDR6().String()})
	node.Labels = map[string]string{v1.LabelTopologyZone: "zone-a", v1.LabelHostname: nodeName}
	if _, err := k.api.CoreV1().Nodes().Create(k.ctx(), node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Node %s: %v", nodeName, err)
	}
	ns := &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "e2e"}}
	if _, err := k.api.CoreV1().Namespaces().Create(k.ctx(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace e2e: %v", err)
	}
	return k
}

// ctx bounds one API call.
func (k *kubeEnv) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	k.t.Cleanup(cancel)
	return ctx
}

// apply creates or updates a Service and its EndpointSlices through
// server-side apply, stamping every slice with the
// endpoints.kubernetes.io/last-change-trigger-time annotation as the
// controller does (kp measures network programming latency from it), and
// deletes the Service's slices it no longer has. mutate, if given, edits the
// objects before they are sent.
func (k *kubeEnv) apply(svc Service, mutate ...func(obj metav1.Object)) {
	k.t.Helper()
	now := time.Now().UTC().Format(time.RFC3339Nano)
	keep := map[string]bool{}
	for _, o := range svc.Objects() {
		obj := o.(metav1.Object)
		if sl, ok := o.(*discovery.EndpointSlice); ok {
			sl.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: now}
			keep[sl.Name] = true
		}
		for _, m := range mutate {
			m(obj)
		}
		data, err := json.Marshal(o)
		if err != nil {
			k.t.Fatal(err)
		}
		force := true
		opts := metav1.PatchOptions{FieldManager: fieldManager, Force: &force}
		ns, name := obj.GetNamespace(), obj.GetName()
		switch o.(type) {
		case *v1.Service:
			_, err = k.api.CoreV1().Services(ns).Patch(k.ctx(), name, types.ApplyPatchType, data, opts)
		case *discovery.EndpointSlice:
			_, err = k.api.DiscoveryV1().EndpointSlices(ns).Patch(k.ctx(), name, types.ApplyPatchType, data, opts)
		}
		if err != nil {
			k.t.Fatalf("apply %T %s/%s: %v", o, ns, name, err)
		}
	}
	k.deleteSlices(svc, keep)
}

// remove deletes a Service and its EndpointSlices.
func (k *kubeEnv) remove(svc Service) {
	k.t.Helper()
	err := k.api.CoreV1().Services(svc.namespace()).Delete(k.ctx(), svc.Name, metav1.DeleteOptions{})
	if err != nil {
		k.t.Fatalf("delete Service %s/%s: %v", svc.namespace(), svc.Name, err)
	}
	k.deleteSlices(svc, nil)
}

func (k *kubeEnv) deleteSlices(svc Service, keep map[string]bool) {
	k.t.Helper()
	slices := k.api.DiscoveryV1().EndpointSlices(svc.namespace())
	list, err := slices.List(k.ctx(), metav1.ListOptions{LabelSelector: discovery.LabelServiceName + "=" + svc.Name})
	if err != nil {
		k.t.Fatalf("list EndpointSlices of %s/%s: %v", svc.namespace(), svc.Name, err)
	}
	for _, sl := range list.Items {
		if keep[sl.Name] {
			continue
		}
		if err := slices.Delete(k.ctx(), sl.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			k.t.Fatalf("delete EndpointSlice %s/%s: %v", sl.Namespace, sl.Name, err)
		}
	}
}

// labelled returns a mutation adding a label to every object.
func labelled(key, value string) func(metav1.Object) {
	return func(o metav1.Object) {
		l := o.GetLabels()
		if l == nil {
			l = map[string]string{}
		}
		l[key] = value
		o.SetLabels(l)
	}
}

// metric sums every series of metric name (a histogram's name_count, say)
// in kp's /metrics, whatever their labels (ip_family). A labelled metric
// has no series until its first observation: that sums to 0.
func (e *env) metric(name string) float64 {
	e.t.Helper()
	var sum float64
	for series, v := range parseMetrics(e.metrics()) {
		if series == name || strings.HasPrefix(series, name+"{") {
			sum += v
		}
	}
	return sum
}

// logShows waits until kp's log holds every one of parts on one line.
func (e *env) logShows(what string, timeout time.Duration, parts ...string) {
	e.t.Helper()
	e.eventually(what, timeout, func() error {
		for _, line := range strings.Split(e.kp.Log(), "\n") {
			if containsAll(line, parts) {
				return nil
			}
		}
		return fmt.Errorf("no line of kp's log holds all of %q", parts)
	})
}

func containsAll(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// silent checks that nothing answers at addr from ns (a Service kp must
// not program): each try fails, by timeout or refusal.
func (e *env) silent(ns, network, addr string) error {
	for i := 0; i < 3; i++ {
		if reply, err := e.w.Dial(ns, network, addr, 500*time.Millisecond); err == nil {
			return fmt.Errorf("%s %s answered %q", network, addr, reply)
		}
	}
	return nil
}

// inZone waits until kp's status API reports its node in zone (the Node's
// topology.kubernetes.io/zone label, as kp last synced it).
func (e *env) inZone(zone string) {
	e.t.Helper()
	e.eventually("kp's node is in "+zone, 15*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := e.statusClient().Services(ctx, "", "")
		if err != nil {
			return err
		}
		if st.Node.Zone != zone {
			return fmt.Errorf("status API: node %s in zone %q", st.Node.Name, st.Node.Zone)
		}
		return nil
	})
}
