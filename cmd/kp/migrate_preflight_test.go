package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"

	"github.com/kpproxy/kp/cmd/kp/options"
	"github.com/kpproxy/kp/internal/kubeclient"
	"github.com/kpproxy/kp/internal/kubeclient/fromclientset"
)

// kubeadmFake is two nodes and kube-proxy as kubeadm deploys it (iptables
// mode), behind the harness's migrate cluster client.
func kubeadmFake(t *testing.T, h *harness, extra ...*v1.ConfigMap) {
	t.Helper()
	cs := fake.NewClientset()
	ctx := context.Background()
	for i, name := range []string{"node-1", "node-2"} {
		n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		n.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: []string{"10.0.0.1", "10.0.0.2"}[i]}}
		n.Spec.PodCIDRs = []string{[]string{"10.244.0.0/24", "10.244.1.0/24"}[i]}
		if _, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cms := append([]*v1.ConfigMap{{ObjectMeta: metav1.ObjectMeta{Name: "kube-proxy", Namespace: "kube-system"}, Data: map[string]string{
		"config.conf": "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: iptables\nclusterCIDR: 10.244.0.0/16\n" +
			"clientConnection: {kubeconfig: /var/lib/kube-proxy/kubeconfig.conf}\n",
		"kubeconfig.conf": "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"https://10.0.0.10:6443\"}}]\n" +
			"contexts: [{name: c, context: {cluster: c}}]\ncurrent-context: c\n",
	}}}, extra...)
	for _, cm := range cms {
		if _, err := cs.CoreV1().ConfigMaps("kube-system").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "kube-proxy", Namespace: "kube-system"}}
	ds.Spec.Template.Spec = v1.PodSpec{
		Containers: []v1.Container{{Name: "kube-proxy", Command: []string{"/usr/local/bin/kube-proxy", "--config=/var/lib/kube-proxy/config.conf"},
			VolumeMounts: []v1.VolumeMount{{Name: "kube-proxy", MountPath: "/var/lib/kube-proxy"}}}},
		Volumes: []v1.Volume{{Name: "kube-proxy", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "kube-proxy"}}}}},
	}
	if _, err := cs.AppsV1().DaemonSets("kube-system").Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.a.clusterClient = func(string, string) (kubeclient.Interface, string, error) {
		return fromclientset.New(cs), "https://api.example:6443", nil
	}
}

func TestMigrateClusterDryRunFromKubeProxyPrintsThePlanAndThePreflight(t *testing.T) {
	h := newHarness(t)
	kubeadmFake(t, h)
	if code := h.run("migrate", "cluster", "--from-kube-proxy", "--dry-run"); code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, h.stderr.String())
	}
	out := h.stdout.String()
	for _, want := range []string{"Migrating from kube-proxy to kp", "Preflight: what changes when kp serves in place of kube-proxy",
		"kp:         nftables mode (kp's default", "Node node-1 (InternalIP 10.0.0.1", "Node node-2 (InternalIP 10.0.0.2",
		"WARNING  localhost-nodeports", "Preflight: 0 error(s)"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
}

func TestMigrateClusterDryRunJSONIsThePreflightAlone(t *testing.T) {
	h := newHarness(t)
	kubeadmFake(t, h)
	if code := h.run("migrate", "cluster", "--from-kube-proxy", "--to", "iptables", "--dry-run", "-o", "json"); code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, h.stderr.String())
	}
	var doc struct {
		KP    struct{ Mode, ModeFrom string }
		Nodes []struct {
			Node  string
			Items []struct{ ID, Severity string }
		}
	}
	if err := json.Unmarshal(h.stdout.Bytes(), &doc); err != nil {
		t.Fatalf("stdout is not one JSON document: %v\n%s", err, h.stdout.String())
	}
	if doc.KP.Mode != "iptables" || doc.KP.ModeFrom != "--to" || len(doc.Nodes) != 2 || len(doc.Nodes[1].Items) != 4 {
		t.Errorf("got %+v", doc)
	}
}

// An error item (kp's ConfigMap still has manifests/' placeholder server)
// fails the dry run, after printing it: refused (exit 3).
func TestMigrateClusterDryRunFailsOnAPreflightError(t *testing.T) {
	h := newHarness(t)
	kubeadmFake(t, h, &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kp", Namespace: "kube-system"}, Data: map[string]string{
		"config.conf":     "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclientConnection: {kubeconfig: /var/lib/kp/kubeconfig.conf}\n",
		"kubeconfig.conf": "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"https://CONTROL-PLANE-ENDPOINT:6443\"}}]\ncontexts: [{name: c, context: {cluster: c}}]\ncurrent-context: c\n",
	}})
	code := h.run("migrate", "cluster", "--from-kube-proxy", "--dry-run")
	if code != exitRefused || !strings.Contains(h.stdout.String(), "ERROR    api-server") || !strings.Contains(h.stderr.String(), "kp: preflight: 1 error(s)") {
		t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s", code, h.stdout.String(), h.stderr.String())
	}
}

func TestMigrateClusterPrintConfigWritesKPsConfigMapFromKubeProxys(t *testing.T) {
	h := newHarness(t)
	kubeadmFake(t, h)
	if code := h.run("migrate", "cluster", "--from-kube-proxy", "--print-config"); code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, h.stderr.String())
	}
	var cm v1.ConfigMap
	if err := yaml.UnmarshalStrict(h.stdout.Bytes(), &cm); err != nil {
		t.Fatalf("%v\n%s", err, h.stdout.String())
	}
	kc, lenient, err := options.DecodeKubeProxyConfiguration([]byte(cm.Data["config.conf"]), "printed")
	if len(lenient) > 0 {
		t.Errorf("the printed configuration decodes only leniently: %v", lenient)
	}
	if err != nil {
		t.Fatal(err)
	}
	if cm.Name != "kp" || kc.ClusterCIDR != "10.244.0.0/16" || kc.Mode != "nftables" || !strings.Contains(cm.Data["kubeconfig.conf"], `"https://10.0.0.10:6443"`) {
		t.Errorf("got %s/%s mode %q clusterCIDR %q\n%s", cm.Namespace, cm.Name, kc.Mode, kc.ClusterCIDR, h.stdout.String())
	}
}

func TestMigrateClusterRefusesPreflightFlagsWhereTheyMeanNothing(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate", "cluster", "--to", "iptables", "--print-config"}, "kp: --print-config writes kp's ConfigMap from kube-proxy's: it goes with --from-kube-proxy"},
		{[]string{"migrate", "cluster", "--from-kube-proxy", "--print-config", "-o", "json"}, "kp: -o json and --print-config: --print-config writes the ConfigMap as YAML"},
		{[]string{"migrate", "cluster", "--from-kube-proxy", "--dry-run", "-o", "yaml"}, `kp: -o "yaml": want text or json`},
	} {
		h := newHarness(t)
		if code := h.run(tc.args...); code != exitUsage || !strings.Contains(h.stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want exit 2 and %q", tc.args, code, h.stderr.String(), tc.want)
		}
	}
}
