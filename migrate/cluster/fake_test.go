package cluster

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/kpproxy/kp/internal/kubeclient/fromclientset"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// world is a fake cluster: Nodes, the two DaemonSets' pods following the
// nodes' kpproxy.io/proxy label (as the DaemonSet controller would, at the
// next pod list), and each node's kp following its kpproxy.io/proxy-mode
// annotation (as kp's switcher would, at the next status read).
type world struct {
	t      *testing.T
	client *fake.Clientset
	clock  *testingclock.FakeClock
	out    bytes.Buffer

	mu sync.Mutex
	kp map[string]*fakeKP // by node
	// kubeProxyRules: kube-proxy's rules are in the node's kernel.
	kubeProxyRules map[string]bool
	// log is what happened, in order: "node-a: annotation iptables",
	// "node-a: label kp", "node-a: kp iptables".
	log []string
	// kubeProxyDS: kube-proxy's DaemonSet exists (pods follow the label).
	kubeProxyDS bool
	// unreadable: the node's kp cannot read one of its backends; its
	// inventory lists no kube-proxy rule and reports this error.
	unreadable map[string]string
}

type fakeKP struct {
	mode       string
	annotation string
	migID      uint64
	failTo     string // a switch to this mode fails
	failErr    string // with this error ("" : iptables cannot run)
	lastSync   time.Time
	started    time.Time
	ended      time.Time
	phase      string
	// leftoverReads: inventory reads that still list kube-proxy's rules
	// after kp started (its take-over not done yet).
	leftoverReads int
}

func newWorld(t *testing.T, nodes ...string) *world {
	w := &world{t: t, client: fake.NewClientset(), clock: testingclock.NewFakeClock(time.Date(2026, 11, 25, 1, 0, 0, 0, time.UTC)),
		kp: map[string]*fakeKP{}, kubeProxyRules: map[string]bool{}}
	for _, n := range nodes {
		if _, err := w.client.CoreV1().Nodes().Create(context.Background(), &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	w.client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		w.syncPods()
		return false, nil, nil
	})
	w.client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		p := a.(k8stesting.PatchAction)
		w.note("%s: patch %s", p.GetName(), p.GetPatch())
		return false, nil, nil
	})
	return w
}

func (w *world) note(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.log = append(w.log, fmt.Sprintf(format, args...))
}

func (w *world) daemonSet(name string) {
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system"},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": name}}}}
	if _, err := w.client.AppsV1().DaemonSets("kube-system").Create(context.Background(), ds, metav1.CreateOptions{}); err != nil {
		w.t.Fatal(err)
	}
}

// runsKP starts kp on every node in mode (kp's DaemonSet, no kube-proxy).
func (w *world) runsKP(mode string) {
	w.daemonSet("kp")
	nodes, _ := w.client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	for _, n := range nodes.Items {
		w.kp[n.Name] = &fakeKP{mode: mode, lastSync: w.clock.Now(), started: w.clock.Now()}
	}
}

// syncPods makes the DaemonSets' pods match the nodes' labels.
func (w *world) syncPods() {
	ctx := context.Background()
	nodes, _ := w.client.Tracker().List(v1.SchemeGroupVersion.WithResource("nodes"), v1.SchemeGroupVersion.WithKind("Node"), "")
	_, kpDSErr := w.client.Tracker().Get(appsv1.SchemeGroupVersion.WithResource("daemonsets"), "kube-system", "kp")
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, n := range nodes.(*v1.NodeList).Items {
		label := n.Labels[LabelProxy]
		wantKP := kpDSErr == nil && label != ProxyKubeProxy
		wantKubeProxy := w.kubeProxyDS && (label == ProxyKubeProxy || label == ProxyHandback)
		w.pod(ctx, "kp", n.Name, wantKP)
		w.pod(ctx, "kube-proxy", n.Name, wantKubeProxy)
		if wantKP && w.kp[n.Name] == nil {
			mode := n.Annotations[annotationProxyMode]
			if mode == "" {
				mode = "nftables"
			}
			w.kp[n.Name] = &fakeKP{mode: mode, annotation: n.Annotations[annotationProxyMode], lastSync: w.clock.Now(),
				started: w.clock.Now(), leftoverReads: 2}
			w.log = append(w.log, fmt.Sprintf("%s: kp starts in %s", n.Name, mode))
		}
		if !wantKP && w.kp[n.Name] != nil {
			w.kp[n.Name] = nil
			w.log = append(w.log, n.Name+": kp leaves")
		}
		if wantKubeProxy && !w.kubeProxyRules[n.Name] {
			w.kubeProxyRules[n.Name] = true
			w.log = append(w.log, n.Name+": kube-proxy's rules written")
		}
	}
}

func (w *world) pod(ctx context.Context, app, node string, want bool) {
	name := app + "-" + node
	_, err := w.client.Tracker().Get(v1.SchemeGroupVersion.WithResource("pods"), "kube-system", name)
	switch {
	case want && err != nil:
		p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system", Labels: map[string]string{"k8s-app": app}},
			Spec:   v1.PodSpec{NodeName: node},
			Status: v1.PodStatus{Phase: v1.PodRunning, Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}}}}
		_ = w.client.Tracker().Add(p)
		w.log = append(w.log, fmt.Sprintf("%s: %s pod starts", node, app))
	case !want && err == nil:
		_ = w.client.Tracker().Delete(v1.SchemeGroupVersion.WithResource("pods"), "kube-system", name)
		w.log = append(w.log, fmt.Sprintf("%s: %s pod leaves", node, app))
	}
}

// Status is the node's kp, which first acts on a new annotation value.
func (w *world) Status(ctx context.Context, pod *v1.Pod) (*statusapi.Status, error) {
	n, err := w.client.CoreV1().Nodes().Get(ctx, pod.Spec.NodeName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	k := w.kp[n.Name]
	if k == nil {
		return nil, fmt.Errorf("no kp on %s", n.Name)
	}
	w.follow(k, n)
	st := &statusapi.Status{Mode: k.mode, Node: n.Name, Healthy: true, StartTime: time.Time{}, ServicePorts: 3,
		LastSync: &statusapi.Sync{Time: k.lastSync}}
	if k.migID > 0 {
		st.Migration = &statusapi.Migration{ID: k.migID, To: k.annotation, Phase: k.phase, Started: k.started, Ended: k.ended}
		if k.phase == statusapi.MigrationFailed {
			st.Migration.Error = "iptables mode cannot run on this node"
			st.Migration.Steps = []statusapi.MigrationStep{{Name: "program", Error: "no iptables"}}
			if k.failErr != "" {
				st.Migration.Error, st.Migration.Steps = k.failErr, nil
			}
		}
	}
	return st, nil
}

// follow makes k act on a new value of n's annotation, as kp's switcher
// does when its informer sees it; w.mu is held.
func (w *world) follow(k *fakeKP, n *v1.Node) {
	if a := n.Annotations[annotationProxyMode]; a != k.annotation {
		k.annotation = a
		if a != "" {
			k.migID++
			k.started, k.ended, k.phase = w.clock.Now(), w.clock.Now(), statusapi.MigrationSucceeded
			if a == k.failTo {
				k.phase = statusapi.MigrationFailed
			} else {
				k.mode, k.lastSync = a, w.clock.Now()
				if a == ModeNone {
					w.log = append(w.log, n.Name+": kp's rules removed")
				}
				if w.kubeProxyRules[n.Name] && a != ModeNone && w.kp[n.Name] != nil {
					w.kubeProxyRules[n.Name] = false // Retire after a switch
				}
			}
			w.log = append(w.log, fmt.Sprintf("%s: kp switch to %s %s", n.Name, a, k.phase))
		}
	}
}

// Inventory lists kube-proxy's rules while they are there: a kp that just
// started takes them over after a few reads (unless in mode none).
func (w *world) Inventory(ctx context.Context, pod *v1.Pod) (*statusapi.Inventory, error) {
	n, err := w.client.CoreV1().Nodes().Get(ctx, pod.Spec.NodeName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	node := pod.Spec.NodeName
	k := w.kp[node]
	if k == nil {
		return nil, fmt.Errorf("no kp on %s", node)
	}
	w.follow(k, n)
	if w.kubeProxyRules[node] && k.mode != ModeNone && !w.kubeProxyDSPodOn(node) {
		if k.leftoverReads > 0 {
			k.leftoverReads--
		} else {
			w.kubeProxyRules[node] = false
			w.log = append(w.log, node+": kp took kube-proxy's rules over")
		}
	}
	inv := &statusapi.Inventory{Node: node, Error: w.unreadable[node]}
	if w.kubeProxyRules[node] && inv.Error == "" {
		inv.Programs = append(inv.Programs, statusapi.Program{Owner: "kube-proxy", Mode: "iptables/ipvs", Chains: 10, Rules: 20})
	}
	if k.mode != ModeNone {
		inv.Programs = append(inv.Programs, statusapi.Program{Owner: "kp", Mode: k.mode, Chains: 5, Rules: 8})
	}
	return inv, nil
}

func (w *world) kubeProxyDSPodOn(node string) bool {
	_, err := w.client.Tracker().Get(v1.SchemeGroupVersion.WithResource("pods"), "kube-system", "kube-proxy-"+node)
	return err == nil
}

func (w *world) controller() *Controller {
	return New(Config{Client: fromclientset.New(w.client), KP: w, Out: &w.out, Clock: w.clock, PollInterval: time.Second})
}

func (w *world) events() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.log...)
}

// index is the position of the first event containing s (-1: none).
func index(log []string, s string) int {
	for i, l := range log {
		if strings.Contains(l, s) {
			return i
		}
	}
	return -1
}

func (w *world) node(name string) *v1.Node {
	n, err := w.client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	return n
}

func (w *world) record(name string) *Record {
	r, err := RecordOf(w.node(name))
	if err != nil {
		w.t.Fatal(err)
	}
	return r
}
