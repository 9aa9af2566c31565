package e2e

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpproxy/kp/test/apiserver"
)

// access is one kind of API call: API group, resource (with its
// subresource, "pods/exec") and verb, as RBAC names them.
type access struct{ group, resource, verb string }

func (a access) String() string {
	return strings.TrimPrefix(a.group+"/", "/") + a.resource + " " + a.verb
}

// kpCalls is every API call kp proxy makes, with where: the informers of
// proxy/source (kube_watch.go: list, then watch, of Services,
// EndpointSlices, ServiceCIDRs and its own Node), the Node's pod CIDRs at
// start (cmd/kp restart.go, nodePodCIDRs: get), and the Events on its Node
// (migrate/event.go: create). kp's API client (internal/kubeclient) has no
// other method that kp proxy uses. Discovery (/version, /apis/...) is
// every authenticated user's.
var kpCalls = map[access]bool{
	{"", "services", "list"}: true, {"", "services", "watch"}: true,
	{"discovery.k8s.io", "endpointslices", "list"}: true, {"discovery.k8s.io", "endpointslices", "watch"}: true,
	{"networking.k8s.io", "servicecidrs", "list"}: true, {"networking.k8s.io", "servicecidrs", "watch"}: true,
	{"", "nodes", "get"}: true, {"", "nodes", "list"}: true, {"", "nodes", "watch"}: true,
	{"", "events", "create"}: true,
}

// everyones is what every authenticated user may do (the bootstrap role
// system:basic-user): ask what it may do, and who it is.
var everyones = map[access]bool{
	{"authorization.k8s.io", "selfsubjectaccessreviews", "create"}: true,
	{"authorization.k8s.io", "selfsubjectrulesreviews", "create"}:  true,
	{"authentication.k8s.io", "selfsubjectreviews", "create"}:      true,
}

// specialVerbs are verbs RBAC knows that no discovery document lists.
var specialVerbs = []access{
	{"", "users", "impersonate"}, {"", "groups", "impersonate"}, {"", "serviceaccounts", "impersonate"},
	{"authentication.k8s.io", "userextras/scopes", "impersonate"},
	{"rbac.authorization.k8s.io", "clusterroles", "bind"}, {"rbac.authorization.k8s.io", "clusterroles", "escalate"},
	{"rbac.authorization.k8s.io", "roles", "bind"}, {"rbac.authorization.k8s.io", "roles", "escalate"},
	{"certificates.k8s.io", "signers", "approve"}, {"certificates.k8s.io", "signers", "sign"},
	{"", "nodes", "*"}, {"", "services", "*"}, {"*", "*", "*"},
}

// TestKPsRoleAllowsWhatKPCallsAndNothingElse reads kp's ClusterRole from
// manifests/clusterrole.yaml: it must grant exactly kpCalls. Then, with the
// kustomization applied to a real kube-apiserver (RBAC authorization),
// kp's ServiceAccount asks the API server (SelfSubjectAccessReview, as the
// ServiceAccount's token) about every verb of every resource and
// subresource it serves, and the verbs RBAC knows beyond them: allowed are
// kpCalls and what every user may, refused everything else. Real calls
// check the answers: kp lists and watches what it reads, gets its Node,
// creates an Event; it may not list Secrets, patch its Node, update or get
// a Service.
func TestKPsRoleAllowsWhatKPCallsAndNothingElse(t *testing.T) {
	apiserver.Bin(t, apiserver.Kubectl)
	t.Parallel()

	granted := roleGrants(t, manifestRole(t))
	for _, a := range sortedAccesses(granted) {
		if !kpCalls[a] {
			t.Errorf("manifests/clusterrole.yaml grants %s, which kp never calls", a)
		}
	}
	for _, a := range sortedAccesses(kpCalls) {
		if !granted[a] {
			t.Errorf("manifests/clusterrole.yaml does not grant %s, which kp calls", a)
		}
	}

	srv := apiserver.Start(t, apiserver.Options{})
	if out, err := srv.Kubectl("apply", "-k", manifestsDir(t)); err != nil {
		t.Fatalf("kubectl apply -k manifests/: %v\n%s", err, out)
	}
	ctx := t.Context()
	token, err := srv.ServiceAccountToken(ctx, "kube-system", "kp")
	if err != nil {
		t.Fatal(err)
	}
	sa := srv.Instance(0).Client(token)

	_, lists, err := srv.Client().Discovery().ServerGroupsAndResources()
	if err != nil {
		t.Fatalf("discovery: %v", err)
	}
	asked := map[access]bool{}
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range l.APIResources {
			for _, verb := range r.Verbs {
				asked[access{gv.Group, r.Name, verb}] = true
			}
		}
	}
	for _, a := range specialVerbs {
		asked[a] = true
	}
	for a := range kpCalls {
		if !asked[a] {
			t.Errorf("the API server serves no %s", a)
		}
	}
	var allowed []string
	for _, a := range sortedAccesses(asked) {
		resource, sub, _ := strings.Cut(a.resource, "/")
		r, err := sa.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Group: a.group, Resource: resource, Subresource: sub, Verb: a.verb}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("may kp %s? %v", a, err)
		}
		want := kpCalls[a] || everyones[a]
		if r.Status.Allowed != want {
			t.Errorf("kp's ServiceAccount may %s: %v (%s), want %v", a, r.Status.Allowed, r.Status.Reason, want)
		}
		if r.Status.Allowed {
			allowed = append(allowed, a.String())
		}
	}
	t.Logf("asked about %d kinds of call; allowed: %s", len(asked), strings.Join(allowed, ", "))

	calls := []struct {
		what    string
		allowed bool
		call    func() error
	}{
		{"list and watch Services", true, func() error {
			return listWatch(ctx, sa.CoreV1().Services("").List, sa.CoreV1().Services("").Watch)
		}},
		{"list and watch EndpointSlices", true, func() error {
			return listWatch(ctx, sa.DiscoveryV1().EndpointSlices("").List, sa.DiscoveryV1().EndpointSlices("").Watch)
		}},
		{"list and watch ServiceCIDRs", true, func() error {
			return listWatch(ctx, sa.NetworkingV1().ServiceCIDRs().List, sa.NetworkingV1().ServiceCIDRs().Watch)
		}},
		{"list and watch Nodes", true, func() error { return listWatch(ctx, sa.CoreV1().Nodes().List, sa.CoreV1().Nodes().Watch) }},
		{"get a Node", true, func() error {
			_, err := sa.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
			if apierrors.IsNotFound(err) { // allowed: there is no such Node
				return nil
			}
			return err
		}},
		{"create an Event", true, func() error {
			now := metav1.Now()
			_, err := sa.CoreV1().Events("default").Create(ctx, &v1.Event{
				ObjectMeta:     metav1.ObjectMeta{GenerateName: "kp-"},
				InvolvedObject: v1.ObjectReference{Kind: "Node", Name: "node-1", UID: "node-1"}, Reason: "Test",
				Message: "from the RBAC test", Type: v1.EventTypeNormal, Source: v1.EventSource{Component: "kp"},
				FirstTimestamp: now, LastTimestamp: now,
			}, metav1.CreateOptions{})
			return err
		}},
		{"list Secrets", false, func() error { _, err := sa.CoreV1().Secrets("").List(ctx, metav1.ListOptions{}); return err }},
		{"patch a Node", false, func() error {
			_, err := sa.CoreV1().Nodes().Patch(ctx, "node-1", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
			return err
		}},
		{"update a Service", false, func() error {
			_, err := sa.CoreV1().Services("default").Update(ctx, &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: "default"}}, metav1.UpdateOptions{})
			return err
		}},
		{"get a Service", false, func() error {
			_, err := sa.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
			return err
		}},
	}
	for _, c := range calls {
		err := c.call()
		switch {
		case c.allowed && err != nil:
			t.Errorf("kp's ServiceAccount may not %s: %v", c.what, err)
		case !c.allowed && !apierrors.IsForbidden(err):
			t.Errorf("kp's ServiceAccount may %s: %v; want forbidden", c.what, err)
		}
	}
}

// manifestRole is the ClusterRole of manifests/clusterrole.yaml.
func manifestRole(t *testing.T) *rbacv1.ClusterRole {
	t.Helper()
	y, err := os.ReadFile(filepath.Join(manifestsDir(t), "clusterrole.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs := decodeAll(t, y)
	if len(objs) != 1 {
		t.Fatalf("clusterrole.yaml holds %d objects, want 1", len(objs))
	}
	role, ok := objs[0].(*rbacv1.ClusterRole)
	if !ok {
		t.Fatalf("clusterrole.yaml holds a %T", objs[0])
	}
	return role
}

// roleGrants lists what role grants, rule by rule (a wildcard is kept as
// "*", and so never matches a call of kpCalls); a rule for URLs, resource
// names or an aggregation is an error, since kp needs none.
func roleGrants(t *testing.T, role *rbacv1.ClusterRole) map[access]bool {
	t.Helper()
	if role.AggregationRule != nil {
		t.Errorf("kp's ClusterRole aggregates other roles: %+v", role.AggregationRule)
	}
	out := map[access]bool{}
	for i, r := range role.Rules {
		if len(r.NonResourceURLs) > 0 || len(r.ResourceNames) > 0 {
			t.Errorf("kp's ClusterRole rule %d names URLs %q or resource names %q", i, r.NonResourceURLs, r.ResourceNames)
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					out[access{g, res, v}] = true
				}
			}
		}
	}
	return out
}

func sortedAccesses(m map[access]bool) []access {
	return slices.SortedFunc(maps.Keys(m), func(a, b access) int { return strings.Compare(a.String(), b.String()) })
}

// listWatch lists, then opens a watch and closes it: what an informer
// does first.
func listWatch[L any, W interface{ Stop() }](ctx context.Context, list func(context.Context, metav1.ListOptions) (L, error),
	watch func(context.Context, metav1.ListOptions) (W, error)) error {
	if _, err := list(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		return err
	}
	w, err := watch(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	w.Stop()
	return nil
}
