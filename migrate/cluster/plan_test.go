package cluster

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func node(name, label string, rec *Record) v1.Node {
	n := v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}, Annotations: map[string]string{}}}
	if label != "" {
		n.Labels[LabelProxy] = label
	}
	if rec != nil {
		n.Annotations[AnnotationMigration] = rec.String()
	}
	return n
}

func TestPlanOrder(t *testing.T) {
	to := Request{To: "iptables", MaxUnavailable: 1}
	back := to
	back.Rollback = true
	kube := Request{FromKubeProxy: true, MaxUnavailable: 1}
	kubeBack := kube
	kubeBack.Rollback = true
	done := &Record{Kind: KindTo, To: "iptables", Phase: PhaseDone}
	failed := &Record{Kind: KindTo, To: "iptables", Phase: PhaseFailed, Step: "switch"}
	other := &Record{Kind: KindTo, To: "userspace", Phase: PhaseDone}
	kubeDone := &Record{Kind: KindFromKubeProxy, Phase: PhaseDone}
	for _, tc := range []struct {
		name  string
		req   Request
		nodes []v1.Node
		want  string // node:action, in order
	}{
		{"fresh nodes go by name", to, []v1.Node{node("c", "", nil), node("a", "", nil), node("b", "", nil)},
			"a:migrate b:migrate c:migrate"},
		{"a failed node resumes first, done nodes are skipped", to,
			[]v1.Node{node("a", "", done), node("b", "", nil), node("c", "", failed)},
			"c:migrate b:migrate a:skip"},
		{"--to skips the nodes kube-proxy still runs", to,
			[]v1.Node{node("a", ProxyKubeProxy, nil), node("b", ProxyKP, nil)}, "b:migrate a:skip"},
		{"another finished rollout's record does not count as done", to,
			[]v1.Node{node("a", "", other)}, "a:migrate"},
		{"rollback takes the reached nodes, last first, and skips the others", back,
			[]v1.Node{node("a", "", done), node("b", "", failed), node("c", "", nil)},
			"b:roll back a:roll back c:skip"},
		{"from kube-proxy skips nodes kp runs already", kube,
			[]v1.Node{node("a", ProxyKP, nil), node("b", ProxyKubeProxy, nil), node("c", "", nil)},
			"b:migrate c:migrate a:skip"},
		{"from kube-proxy: a done record on a node labeled back to kube-proxy is redone", kube,
			[]v1.Node{node("a", ProxyKubeProxy, kubeDone), node("b", ProxyKP, kubeDone)},
			"a:migrate b:skip"},
		{"from kube-proxy rollback goes by the label too (a later --to replaced the record)", kubeBack,
			[]v1.Node{node("a", ProxyKP, nil), node("b", ProxyHandback, done), node("c", ProxyKubeProxy, nil)},
			"b:roll back a:roll back c:skip"},
		{"from kube-proxy rollback", kubeBack,
			[]v1.Node{node("a", ProxyKP, kubeDone), node("b", ProxyKP, kubeDone), node("c", ProxyKubeProxy, nil)},
			"b:roll back a:roll back c:skip"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewPlan(tc.req, tc.nodes)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, n := range p.Nodes {
				got = append(got, n.Node+":"+n.Action)
			}
			if g := strings.Join(got, " "); g != tc.want {
				t.Errorf("plan %q, want %q\n%s", g, tc.want, p)
			}
		})
	}
}

func TestPlanRefusesWhileAnotherRolloutIsUnfinished(t *testing.T) {
	running := &Record{Kind: KindTo, To: "userspace", Phase: PhaseFailed}
	_, err := NewPlan(Request{To: "iptables", MaxUnavailable: 1}, []v1.Node{node("a", "", running)})
	if err == nil || !strings.Contains(err.Error(), "node a: another rollout") {
		t.Fatalf("want an error naming node a, got %v", err)
	}
}

func TestRequestValidate(t *testing.T) {
	for _, tc := range []struct {
		req  Request
		want string
	}{
		{Request{MaxUnavailable: 1}, "--to MODE or --from-kube-proxy"},
		{Request{To: "none", MaxUnavailable: 1}, "rollback's"},
		{Request{To: "iptables"}, "--max-unavailable 0"},
		{Request{FromKubeProxy: true, MaxUnavailable: 1}, ""},
	} {
		err := tc.req.Validate()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: %v, want %q", tc.req, err, tc.want)
		}
	}
}

func TestRequireAffinityANDsIntoEveryTermOnce(t *testing.T) {
	w := newWorld(t)
	w.daemonSet("kp")
	ds, _, err := w.controller().ensureAffinity(t.Context(), "kp", kpAffinity)
	if err != nil {
		t.Fatal(err)
	}
	ds.Spec.Template.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms = append(
		ds.Spec.Template.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms,
		v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{{Key: "zone", Operator: v1.NodeSelectorOpExists}}})
	if !requireAffinity(ds, kpAffinity) {
		t.Fatal("a term without the requirement was not changed")
	}
	if requireAffinity(ds, kpAffinity) {
		t.Fatal("a second call changed it again")
	}
	for i, term := range ds.Spec.Template.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		n := 0
		for _, e := range term.MatchExpressions {
			if e.Key == LabelProxy {
				n++
			}
		}
		if n != 1 {
			t.Errorf("term %d has %d expressions on %s", i, n, LabelProxy)
		}
	}
}
