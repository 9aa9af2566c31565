package cluster

import (
	"context"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
)

func fromKubeProxy() Request {
	return Request{FromKubeProxy: true, MaxUnavailable: 1, Pause: true, NodeTimeout: time.Minute}
}

// kubeProxyCluster is kube-proxy's DaemonSet on every node, its rules in
// every kernel, no kp yet.
func kubeProxyCluster(t *testing.T, nodes ...string) *world {
	w := newWorld(t, nodes...)
	w.daemonSet("kube-proxy")
	w.kubeProxyDS = true
	for _, n := range nodes {
		w.kubeProxyRules[n] = true
	}
	return w
}

func TestFromKubeProxyAsksForKPsDaemonSetAfterLabelingEveryNode(t *testing.T) {
	w := kubeProxyCluster(t, "node-a", "node-b")
	err := w.controller().Run(context.Background(), fromKubeProxy())
	if err == nil || !strings.Contains(err.Error(), "apply kp's manifests now") {
		t.Fatalf("want the command to ask for kp's DaemonSet, got %v", err)
	}
	for _, n := range []string{"node-a", "node-b"} {
		if l := w.node(n).Labels[LabelProxy]; l != ProxyKubeProxy {
			t.Errorf("%s: label %q, want kube-proxy", n, l)
		}
	}
	ds, _ := w.client.AppsV1().DaemonSets("kube-system").Get(context.Background(), "kube-proxy", metav1.GetOptions{})
	terms := ds.Spec.Template.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 || len(terms[0].MatchExpressions) != 1 || terms[0].MatchExpressions[0].Operator != v1.NodeSelectorOpIn {
		t.Errorf("kube-proxy's affinity: %+v", terms)
	}
}

func TestFromKubeProxyMovesANodeOnlyOnceThePreviousIsTakenOver(t *testing.T) {
	w := kubeProxyCluster(t, "node-a", "node-b", "node-c")
	_ = w.controller().Run(context.Background(), fromKubeProxy()) // labels, asks for kp
	w.daemonSet("kp")
	if err := w.controller().Run(context.Background(), fromKubeProxy()); err != nil {
		t.Fatalf("%v\n%s", err, w.out.String())
	}
	log := w.events()
	for i, n := range []string{"node-a", "node-b"} {
		next := []string{"node-b", "node-c"}[i]
		done := index(log, n+": kp took kube-proxy's rules over")
		labeled := index(log, next+`: patch {"metadata":{"labels":{"kpproxy.io/proxy":"kp"}}}`)
		if done < 0 || labeled < done {
			t.Errorf("%s labeled kp (event %d) before kp took %s over (event %d):\n%s", next, labeled, n, done, strings.Join(log, "\n"))
		}
	}
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		if w.kubeProxyRules[n] || w.kp[n] == nil || w.kubeProxyDSPodOn(n) {
			t.Errorf("%s: kube-proxy rules %v, kp %v, kube-proxy pod %v", n, w.kubeProxyRules[n], w.kp[n] != nil, w.kubeProxyDSPodOn(n))
		}
		if r := w.record(n); r == nil || r.Phase != PhaseDone {
			t.Errorf("%s: record %v", n, r)
		}
	}
	if _, err := w.client.AppsV1().DaemonSets("kube-system").Get(context.Background(), "kube-proxy", metav1.GetOptions{}); err != nil {
		t.Errorf("kube-proxy's DaemonSet after a migration without --delete-kube-proxy: %v; want it kept for a rollback", err)
	}
	if !strings.Contains(w.out.String(), "take-over") {
		t.Errorf("progress names no take-over step:\n%s", w.out.String())
	}
}

func TestFromKubeProxyRollbackHandsBackWithKubeProxyServingBeforeKPsRulesGo(t *testing.T) {
	w := kubeProxyCluster(t, "node-a", "node-b")
	_ = w.controller().Run(context.Background(), fromKubeProxy())
	w.daemonSet("kp")
	req := fromKubeProxy() // keeps kube-proxy's DaemonSet: the default
	if err := w.controller().Run(context.Background(), req); err != nil {
		t.Fatalf("%v\n%s", err, w.out.String())
	}
	req.Rollback = true
	if err := w.controller().Run(context.Background(), req); err != nil {
		t.Fatalf("rollback: %v\n%s", err, w.out.String())
	}
	log := w.events()
	for _, n := range []string{"node-a", "node-b"} {
		written := lastIndex(log, n+": kube-proxy's rules written")
		none := lastIndex(log, n+": kp's rules removed")
		leaves := lastIndex(log, n+": kp leaves")
		if written < 0 || none < written || leaves < none {
			t.Errorf("%s: kube-proxy's rules written at event %d, kp's removed at %d, kp left at %d: want that order\n%s",
				n, written, none, leaves, strings.Join(log, "\n"))
		}
		if !w.kubeProxyRules[n] {
			t.Errorf("%s: kube-proxy's rules gone after the rollback", n)
		}
		nd := w.node(n)
		if nd.Labels[LabelProxy] != ProxyKubeProxy || len(nd.Annotations) != 0 {
			t.Errorf("%s after the rollback: labels %v, annotations %v", n, nd.Labels, nd.Annotations)
		}
	}
	if b, a := lastIndex(log, "node-b: kp leaves"), lastIndex(log, "node-a: kp leaves"); b > a {
		t.Errorf("rollback order: node-b (event %d) should go back before node-a (event %d)", b, a)
	}
}

// The way back: kube-proxy's DaemonSet is kept unless the migration is
// told to delete it, and a later run with --delete-kube-proxy deletes it
// once every node runs kp.
func TestFromKubeProxyKeepsKubeProxysDaemonSetUnlessToldToDeleteIt(t *testing.T) {
	w := kubeProxyCluster(t, "node-a", "node-b")
	_ = w.controller().Run(context.Background(), fromKubeProxy())
	w.daemonSet("kp")
	if err := w.controller().Run(context.Background(), fromKubeProxy()); err != nil {
		t.Fatalf("%v\n%s", err, w.out.String())
	}
	dss := w.client.AppsV1().DaemonSets("kube-system")
	if _, err := dss.Get(context.Background(), "kube-proxy", metav1.GetOptions{}); err != nil {
		t.Fatalf("kube-proxy's DaemonSet after a migration without --delete-kube-proxy: %v; want it kept", err)
	}
	if !strings.Contains(w.out.String(), "is kept and runs nowhere") {
		t.Errorf("the end of the rollout does not say kube-proxy's DaemonSet is kept:\n%s", w.out.String())
	}
	req := fromKubeProxy()
	req.DeleteKubeProxy = true
	if err := w.controller().Run(context.Background(), req); err != nil {
		t.Fatalf("--delete-kube-proxy once every node runs kp: %v\n%s", err, w.out.String())
	}
	if _, err := dss.Get(context.Background(), "kube-proxy", metav1.GetOptions{}); err == nil {
		t.Error("kube-proxy's DaemonSet still there after --delete-kube-proxy")
	}
}

func TestFromKubeProxyRollbackNeedsKubeProxysDaemonSet(t *testing.T) {
	w := kubeProxyCluster(t, "node-a")
	_ = w.controller().Run(context.Background(), fromKubeProxy())
	w.daemonSet("kp")
	req := fromKubeProxy()
	req.DeleteKubeProxy = true
	if err := w.controller().Run(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	req.Rollback = true
	err := w.controller().Run(context.Background(), req)
	if err == nil || !strings.Contains(err.Error(), "--delete-kube-proxy deletes it") {
		t.Fatalf("want an error saying kube-proxy's DaemonSet is gone, got %v", err)
	}
}

// A kp started without --allow-mode-none refuses the annotation none (as
// migrate.Switcher does, a failed switch in its status): the hand-back
// stops there (its "kp rules gone" gate sees the failed switch) with kp's
// reason, and the node keeps kp's rules and kube-proxy's.
func TestFromKubeProxyRollbackStopsWhereKPRefusesModeNone(t *testing.T) {
	w := kubeProxyCluster(t, "node-a")
	_ = w.controller().Run(context.Background(), fromKubeProxy())
	w.daemonSet("kp")
	req := fromKubeProxy() // kube-proxy's DaemonSet kept, as by default
	if err := w.controller().Run(context.Background(), req); err != nil {
		t.Fatalf("%v\n%s", err, w.out.String())
	}
	const refusal = "mode none ... this kp runs without --allow-mode-none, so it refuses; nothing changed"
	w.kp["node-a"].failTo, w.kp["node-a"].failErr = ModeNone, refusal
	req.Rollback = true
	err := w.controller().Run(context.Background(), req)
	if err == nil || !strings.Contains(err.Error(), "step kp rules gone") || !strings.Contains(err.Error(), refusal) {
		t.Fatalf("rollback: want it stopped waiting for kp's rules to go, with kp's reason, got %v\n%s", err, w.out.String())
	}
	if w.kp["node-a"] == nil || w.kp["node-a"].mode == ModeNone || !w.kubeProxyRules["node-a"] {
		t.Errorf("node-a after the refusal: kp %+v, kube-proxy's rules %v", w.kp["node-a"], w.kubeProxyRules["node-a"])
	}
}

func lastIndex(log []string, s string) int {
	for i := len(log) - 1; i >= 0; i-- {
		if strings.Contains(log[i], s) {
			return i
		}
	}
	return -1
}

func TestFromKubeProxyAsksKPToTakeOverAgainWhenLeftoversOutliveItsTakeOver(t *testing.T) {
	w := kubeProxyCluster(t, "node-a")
	_ = w.controller().Run(context.Background(), fromKubeProxy())
	w.daemonSet("kp")
	// A take-over that never finishes by itself: only a switch removes them.
	w.client.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
		w.mu.Lock()
		if k := w.kp["node-a"]; k != nil && k.leftoverReads > 0 && k.leftoverReads < 1000 {
			k.leftoverReads = 1000
		}
		w.mu.Unlock()
		return false, nil, nil
	})
	if err := w.controller().Run(context.Background(), fromKubeProxy()); err != nil {
		t.Fatalf("%v\n%s", err, w.out.String())
	}
	if !strings.Contains(w.out.String(), "after a second take-over: kpproxy.io/proxy-mode=nftables") {
		t.Errorf("no second take-over in the progress:\n%s", w.out.String())
	}
	if w.kubeProxyRules["node-a"] {
		t.Error("kube-proxy's rules still there")
	}
}

// A kp that cannot read one of its node's backends (iptables-legacy
// without NET_RAW) lists no kube-proxy rule there and says why: the
// take-over gate never takes that for "no kube-proxy rule left", the node
// fails with the cause, and no further node moves.
func TestFromKubeProxyGateFailsWhenKPCannotReadABackend(t *testing.T) {
	w := kubeProxyCluster(t, "node-a", "node-b")
	_ = w.controller().Run(context.Background(), fromKubeProxy())
	w.daemonSet("kp")
	const cause = "cannot read the rules of iptables-legacy (IPv4): iptables-legacy-save: exit status 1: Permission denied (you must be root)"
	w.unreadable = map[string]string{"node-a": cause}
	err := w.controller().Run(context.Background(), fromKubeProxy())
	if err == nil || !strings.Contains(err.Error(), "take-over") || !strings.Contains(err.Error(), cause) {
		t.Fatalf("Run = %v; want node-a's take-over to fail naming the cause\n%s", err, w.out.String())
	}
	if r := w.record("node-a"); r == nil || r.Phase == PhaseDone {
		t.Errorf("node-a recorded %v; want not done", r)
	}
	if l := w.node("node-b").Labels[LabelProxy]; l != ProxyKubeProxy {
		t.Errorf("node-b labeled %q after node-a's gate failed; want it left to kube-proxy", l)
	}
}
