package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/kpproxy/kp/test/apiserver"
	"github.com/kpproxy/kp/test/bench"
	"github.com/kpproxy/kp/test/netns"
)

// manifestsDir is the deployment kustomization, manifests/ at the module root.
func manifestsDir(t *testing.T) string {
	t.Helper()
	root, err := netns.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "manifests")
}

// The objects the kustomization holds, as kubectl names them.
var deployedObjects = []string{
	"serviceaccount/kp", "clusterrole.rbac.authorization.k8s.io/kp",
	"clusterrolebinding.rbac.authorization.k8s.io/kp", "configmap/kp", "daemonset.apps/kp",
}

func TestManifestsAreAcceptedByTheAPIServerInADryRun(t *testing.T) {
	netns.Require(t)
	apiserver.Bin(t, apiserver.Kubectl)
	t.Parallel()
	srv := apiserver.Start(t, apiserver.Options{})
	out, err := srv.Kubectl("apply", "-k", manifestsDir(t), "--dry-run=server")
	if err != nil {
		t.Fatalf("kubectl apply -k manifests/ --dry-run=server: %v\n%s", err, out)
	}
	for _, o := range deployedObjects {
		if !strings.Contains(out, o+" created (server dry run)") {
			t.Errorf("kubectl did not create %s in the dry run:\n%s", o, out)
		}
	}
	// A dry run leaves nothing behind.
	_, err = srv.Client().AppsV1().DaemonSets("kube-system").Get(t.Context(), "kp", metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("after a dry run, DaemonSet kube-system/kp: %v; want not found", err)
	}
}

func TestKpWorksWithOnlyItsServiceAccountsRoleAndTheRoleAllowsNothingMore(t *testing.T) {
	apiserver.Bin(t, apiserver.Kubectl)
	k := newKubeEnv(t, modeNFTables, 3, apiserver.Options{})
	pods := k.w.Pods()
	if out, err := k.srv.Kubectl("apply", "-k", manifestsDir(t)); err != nil {
		t.Fatalf("kubectl apply -k manifests/: %v\n%s", err, out)
	}
	token, err := k.srv.ServiceAccountToken(k.ctx(), "kube-system", "kp")
	if err != nil {
		t.Fatal(err)
	}
	// kp as the DaemonSet runs it: the ConfigMap's files, the service
	// account's token and CA where the kubelet mounts them. The test moves
	// those paths into a folder of its own and points the kubeconfig at
	// the test's API server. What moves kp into the test's world
	// (addresses, the sync period) goes into the file: beside --config, kp
	// ignores the flags that have a field in it, as kube-proxy does (the
	// node name, a flag, still applies).
	cm, err := k.api.CoreV1().ConfigMaps("kube-system").Get(k.ctx(), "kp", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("ConfigMap kube-system/kp: %v", err)
	}
	dir := t.TempDir()
	moved := strings.NewReplacer(
		"/var/lib/kp/", dir+"/",
		"/var/run/secrets/kubernetes.io/serviceaccount/", dir+"/",
		"https://CONTROL-PLANE-ENDPOINT:6443", "https://"+k.srv.Instance(0).Addr.String(),
	)
	files := map[string]string{"token": token, "ca.crt": string(k.srv.CA())}
	for _, name := range []string{"config.conf", "kubeconfig.conf"} {
		if cm.Data[name] == "" {
			t.Fatalf("ConfigMap kube-system/kp has no %s", name)
		}
		files[name] = moved.Replace(cm.Data[name])
	}
	files["config.conf"] = withSettings(t, files["config.conf"], map[string]any{
		"clusterCIDR": k.w.ClusterCIDR(), "healthzBindAddress": healthzAddr, "metricsBindAddress": metricsAddr,
		"nftables":  map[string]any{"minSyncPeriod": "100ms"},
		"conntrack": map[string]any{"maxPerCore": 0},
		"logging":   map[string]any{"verbosity": 2},
	})
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	k.source = []string{"--config", filepath.Join(dir, "config.conf")}
	k.apply(web(pods[0], pods[1]))
	k.startKP()
	k.answers(k.w.Client(), "tcp", webTCP, pods[0].Name, pods[1].Name)
	// Watches work too, not just the first list.
	k.apply(web(pods[2]))
	k.answers(k.w.Client(), "tcp", webTCP, pods[2].Name)
	k.patchNodeZone("zone-b")
	k.inZone("zone-b")
	if log := strings.ToLower(k.kp.Log()); strings.Contains(log, "forbidden") {
		t.Errorf("kp met a refusal with its own role:\n%s", k.kp.Log())
	}

	sa := k.srv.Instance(0).Client(token)
	ctx := k.ctx()
	node := &v1.ObjectReference{Kind: "Node", Name: nodeName, UID: types.UID(nodeName)}
	now := metav1.Now()
	allowed := []struct {
		what string
		call func() error
	}{
		{"list Services", func() error { _, err := sa.CoreV1().Services("").List(ctx, metav1.ListOptions{}); return err }},
		{"list EndpointSlices", func() error {
			_, err := sa.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
			return err
		}},
		{"get its Node", func() error { _, err := sa.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{}); return err }},
		{"list ServiceCIDRs", func() error {
			_, err := sa.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{})
			return err
		}},
		{"create an Event", func() error {
			_, err := sa.CoreV1().Events("default").Create(ctx, &v1.Event{
				ObjectMeta:     metav1.ObjectMeta{GenerateName: "kp-"},
				InvolvedObject: *node, Reason: "Test", Message: "from the RBAC test", Type: v1.EventTypeNormal,
				Source: v1.EventSource{Component: "kp"}, FirstTimestamp: now, LastTimestamp: now,
			}, metav1.CreateOptions{})
			return err
		}},
	}
	for _, a := range allowed {
		if err := a.call(); err != nil {
			t.Errorf("kp's role does not allow it to %s: %v", a.what, err)
		}
	}

	refused := []struct {
		what string
		call func() error
	}{
		{"list Secrets", func() error { _, err := sa.CoreV1().Secrets("").List(ctx, metav1.ListOptions{}); return err }},
		{"list Pods", func() error { _, err := sa.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); return err }},
		{"list Endpoints", func() error { _, err := sa.CoreV1().Endpoints("").List(ctx, metav1.ListOptions{}); return err }},
		{"read its ConfigMap", func() error {
			_, err := sa.CoreV1().ConfigMaps("kube-system").Get(ctx, "kp", metav1.GetOptions{})
			return err
		}},
		{"create a Service", func() error {
			_, err := sa.CoreV1().Services("e2e").Create(ctx, &v1.Service{
				ObjectMeta: metav1.ObjectMeta{Name: "intruder"},
				Spec:       v1.ServiceSpec{Ports: []v1.ServicePort{{Port: 80}}},
			}, metav1.CreateOptions{})
			return err
		}},
		{"delete a Service", func() error { return sa.CoreV1().Services("e2e").Delete(ctx, "web", metav1.DeleteOptions{}) }},
		{"edit an EndpointSlice", func() error {
			_, err := sa.DiscoveryV1().EndpointSlices("e2e").Patch(ctx, "web-ipv4-0", types.MergePatchType,
				[]byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
			return err
		}},
		{"label its Node", func() error {
			_, err := sa.CoreV1().Nodes().Patch(ctx, nodeName, types.MergePatchType,
				[]byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
			return err
		}},
		{"delete an Event", func() error {
			return sa.CoreV1().Events("default").DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		}},
		{"list Events", func() error { _, err := sa.CoreV1().Events("").List(ctx, metav1.ListOptions{}); return err }},
		// kp writes core Events itself; client-go's recorder, which may
		// use events.k8s.io, is not in kp.
		{"create an events.k8s.io Event", func() error {
			_, err := sa.EventsV1().Events("default").Create(ctx, &eventsv1.Event{
				ObjectMeta: metav1.ObjectMeta{GenerateName: "kp-"}, EventTime: metav1.NowMicro(),
				ReportingController: "kp", ReportingInstance: "kp-" + nodeName, Action: "Test", Reason: "Test",
				Regarding: *node, Note: "from the RBAC test", Type: v1.EventTypeNormal,
			}, metav1.CreateOptions{})
			return err
		}},
		{"get a Service", func() error {
			_, err := sa.CoreV1().Services("e2e").Get(ctx, "web", metav1.GetOptions{})
			return err
		}},
		{"update its DaemonSet", func() error {
			_, err := sa.AppsV1().DaemonSets("kube-system").Patch(ctx, "kp", types.MergePatchType,
				[]byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
			return err
		}},
	}
	for _, r := range refused {
		if err := r.call(); !apierrors.IsForbidden(err) {
			t.Errorf("kp's role lets it %s: %v; want forbidden", r.what, err)
		}
	}
}

// patchNodeZone sets the node's topology.kubernetes.io/zone label.
func (k *kubeEnv) patchNodeZone(zone string) {
	k.t.Helper()
	patch := []byte(`{"metadata":{"labels":{"` + v1.LabelTopologyZone + `":"` + zone + `"}}}`)
	if _, err := k.api.CoreV1().Nodes().Patch(k.ctx(), nodeName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		k.t.Fatalf("relabel Node %s: %v", nodeName, err)
	}
}

func TestDaemonSetRunsTheBinaryTheDockerfileInstalls(t *testing.T) {
	dir := manifestsDir(t)
	dockerfile, err := os.ReadFile(filepath.Join(filepath.Dir(dir), "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^ENTRYPOINT \["([^"]+)"\]`).FindSubmatch(dockerfile)
	if m == nil {
		t.Fatalf("Dockerfile has no exec-form ENTRYPOINT")
	}
	c := shippedDaemonSet(t).Spec.Template.Spec.Containers[0]
	if len(c.Command) == 0 || c.Command[0] != string(m[1]) {
		t.Errorf("DaemonSet runs %q; the image's kp is %s", c.Command, m[1])
	}
	caps := c.SecurityContext.Capabilities
	if len(caps.Drop) != 1 || caps.Drop[0] != "ALL" || len(caps.Add) != 2 || caps.Add[0] != "NET_ADMIN" || caps.Add[1] != "NET_RAW" {
		t.Errorf("capabilities %+v; kp needs NET_ADMIN, NET_RAW (iptables-legacy) and nothing else", caps)
	}
}

// shippedDaemonSet is manifests/daemonset.yaml, decoded strictly.
func shippedDaemonSet(t *testing.T) *appsv1.DaemonSet {
	t.Helper()
	y, err := os.ReadFile(filepath.Join(manifestsDir(t), "daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs := decodeAll(t, y)
	if len(objs) != 1 {
		t.Fatalf("daemonset.yaml holds %d objects, want 1", len(objs))
	}
	ds, ok := objs[0].(*appsv1.DaemonSet)
	if !ok {
		t.Fatalf("daemonset.yaml holds a %T", objs[0])
	}
	return ds
}

// The proxy container's resources cover what the benchmark measured of kp
// at 10,000 Services (its nftables mode, the manifest's): the memory
// request at least the idle RSS, the memory limit at least the cold
// start's peak RSS plus its largest child's (the cgroup counts both), each
// the worst run of test/bench/results.json; the CPU request at least the
// idle CPU; and no CPU limit, which would throttle syncs. A benchmark that
// measures more fails this test until the manifest is sized again.
func TestDaemonSetResourcesCoverTheBenchmark(t *testing.T) {
	const n = 10000
	root, err := netns.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(root, "test", "bench", "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res bench.Results
	if err := json.Unmarshal(raw, &res); err != nil {
		t.Fatalf("test/bench/results.json: %v", err)
	}
	var idleRSS, peak int64
	var idleCPU float64 // cores
	for _, i := range res.Idles {
		if i.Proxy == bench.KP && i.N == n && i.Window > 0 {
			idleRSS, idleCPU = max(idleRSS, i.RSS), max(idleCPU, i.CPUSeconds/i.Window)
		}
	}
	for _, f := range res.FullSyncs {
		if f.Proxy == bench.KP && f.N == n && !f.Unfinished {
			peak = max(peak, f.PeakRSS+f.ChildRSS)
		}
	}
	if idleRSS == 0 || peak == 0 {
		t.Fatalf("test/bench/results.json has no idle RSS (%d) or cold start peak (%d) of %s at N = %d", idleRSS, peak, bench.KP, n)
	}
	t.Logf("%s at N = %d: idle %.1f MiB, %.4f cores; peak with its child %.1f MiB", bench.KP, n, mib(idleRSS), idleCPU, mib(peak))

	c := shippedDaemonSet(t).Spec.Template.Spec.Containers[0]
	req, lim := c.Resources.Requests, c.Resources.Limits
	if got := req.Memory().Value(); got < idleRSS {
		t.Errorf("memory request %s (%.1f MiB) is below kp's idle RSS at N = %d, %.1f MiB", req.Memory(), mib(got), n, mib(idleRSS))
	}
	if got := lim.Memory().Value(); got == 0 {
		t.Errorf("no memory limit; want at least kp's peak at N = %d, %.1f MiB", n, mib(peak))
	} else if got < peak {
		t.Errorf("memory limit %s (%.1f MiB) is below kp's peak at N = %d, %.1f MiB", lim.Memory(), mib(got), n, mib(peak))
	}
	if got := req.Cpu().AsApproximateFloat64(); got < idleCPU {
		t.Errorf("CPU request %s is below kp's idle CPU at N = %d, %.4f cores", req.Cpu(), n, idleCPU)
	}
	if !lim.Cpu().IsZero() {
		t.Errorf("CPU limit %s: a throttled kp falls behind the Service changes", lim.Cpu())
	}
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// withSettings returns the KubeProxyConfiguration config with settings
// merged in (a map merges into the section of the same name).
func withSettings(t *testing.T, config string, settings map[string]any) string {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal([]byte(config), &m); err != nil {
		t.Fatalf("the ConfigMap's config.conf: %v", err)
	}
	merge(m, settings)
	out, err := yaml.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func merge(dst, src map[string]any) {
	for k, v := range src {
		sub, isMap := v.(map[string]any)
		if have, ok := dst[k].(map[string]any); ok && isMap {
			merge(have, sub)
			continue
		}
		dst[k] = v
	}
}
