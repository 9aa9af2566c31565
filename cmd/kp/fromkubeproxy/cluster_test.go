package fromkubeproxy

import (
	"context"
	"os"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"

	"github.com/kpproxy/kp/internal/kubeclient/fromclientset"
)

const (
	kubeProxyServer = "https://10.0.0.10:6443"
	header          = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
)

// testCluster is a fake API server holding kube-proxy as kubeadm deploys
// it, and nodes.
type testCluster struct {
	t      *testing.T
	client *fake.Clientset
}

func newTestCluster(t *testing.T, nodes ...*v1.Node) *testCluster {
	c := &testCluster{t: t, client: fake.NewClientset()}
	for _, n := range nodes {
		c.create(n)
	}
	return c
}

func (c *testCluster) create(obj any) {
	c.t.Helper()
	ctx := context.Background()
	var err error
	switch o := obj.(type) {
	case *v1.Node:
		_, err = c.client.CoreV1().Nodes().Create(ctx, o, metav1.CreateOptions{})
	case *v1.ConfigMap:
		_, err = c.client.CoreV1().ConfigMaps(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
	case *appsv1.DaemonSet:
		_, err = c.client.AppsV1().DaemonSets(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
	}
	if err != nil {
		c.t.Fatal(err)
	}
}

// kubeadm deploys kube-proxy as kubeadm does: --config into ConfigMap
// kube-proxy's config.conf, its kubeconfig in kubeconfig.conf.
func (c *testCluster) kubeadm(config string) *testCluster {
	c.create(configMap("kube-proxy", map[string]string{"config.conf": header + config, "kubeconfig.conf": kubeconfigFor(kubeProxyServer)}))
	c.create(daemonSet("kube-proxy", []string{"/usr/local/bin/kube-proxy", "--config=/var/lib/kube-proxy/config.conf", "--hostname-override=$(NODE_NAME)"},
		v1.VolumeMount{Name: "kube-proxy", MountPath: "/var/lib/kube-proxy"}, configMapVolume("kube-proxy", "kube-proxy")))
	if !strings.Contains(config, "clientConnection") {
		// kubeadm's file names its kubeconfig; the tests' short files add it.
		cm, _ := c.client.CoreV1().ConfigMaps("kube-system").Get(context.Background(), "kube-proxy", metav1.GetOptions{})
		cm.Data["config.conf"] += "clientConnection:\n  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf\n"
		if _, err := c.client.CoreV1().ConfigMaps("kube-system").Update(context.Background(), cm, metav1.UpdateOptions{}); err != nil {
			c.t.Fatal(err)
		}
	}
	return c
}

// manifestsKP creates kp's ConfigMap as manifests/configmap.yaml has it.
func (c *testCluster) manifestsKP() *testCluster {
	c.t.Helper()
	data, err := os.ReadFile("../../../manifests/configmap.yaml")
	if err != nil {
		c.t.Fatal(err)
	}
	var cm v1.ConfigMap
	if err := yaml.UnmarshalStrict(data, &cm); err != nil {
		c.t.Fatal(err)
	}
	c.create(&cm)
	return c
}

func (c *testCluster) read() *Cluster {
	c.t.Helper()
	cl, err := Reader{Client: fromclientset.New(c.client), Namespace: "kube-system", KubeProxyDaemonSet: "kube-proxy", KPDaemonSet: "kp",
		Server: "https://api.example:6443"}.Read(context.Background())
	if err != nil {
		c.t.Fatal(err)
	}
	return cl
}

func configMap(name string, data map[string]string) *v1.ConfigMap {
	return &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system"}, Data: data}
}

func configMapVolume(name, cm string) v1.Volume {
	return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: cm}}}}
}

func daemonSet(name string, command []string, mount v1.VolumeMount, vol v1.Volume) *appsv1.DaemonSet {
	return &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system"},
		Spec: appsv1.DaemonSetSpec{Template: v1.PodTemplateSpec{Spec: v1.PodSpec{
			Containers: []v1.Container{{Name: name, Command: command, VolumeMounts: []v1.VolumeMount{mount}}},
			Volumes:    []v1.Volume{vol},
		}}}}
}

func kubeconfigFor(server string) string {
	return `apiVersion: v1
kind: Config
clusters:
  - name: default
    cluster: {server: "` + server + `"}
contexts:
  - name: default
    context: {cluster: default, user: default}
users:
  - name: default
    user: {tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token}
current-context: default
`
}

// node is a Node with one InternalIP, a podCIDR and 2 CPUs.
func node(name, ip, podCIDR string) *v1.Node {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	n.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: ip}}
	n.Status.Capacity = v1.ResourceList{v1.ResourceCPU: resource.MustParse("2")}
	if podCIDR != "" {
		n.Spec.PodCIDR, n.Spec.PodCIDRs = podCIDR, []string{podCIDR}
	}
	return n
}

func TestReadFindsKubeProxysConfigThroughItsDaemonSet(t *testing.T) {
	c := newTestCluster(t, node("node-1", "10.0.0.1", "10.244.0.0/24"))
	// EKS's layout: another ConfigMap, key and mount.
	c.create(configMap("kube-proxy-config", map[string]string{"config": header + "mode: iptables\nclusterCIDR: 10.244.0.0/16\n"}))
	c.create(daemonSet("kube-proxy", []string{"kube-proxy", "--v=2", "--config", "/var/lib/kube-proxy-config/config", "--hostname-override=$(NODE_NAME)"},
		v1.VolumeMount{Name: "config", MountPath: "/var/lib/kube-proxy-config/"}, configMapVolume("config", "kube-proxy-config")))
	cl := c.read()
	if cl.KubeProxy.Source != "ConfigMap kube-system/kube-proxy-config, key config" || cl.KubeProxy.KC.ClusterCIDR != "10.244.0.0/16" {
		t.Errorf("kube-proxy's config from %q: %+v", cl.KubeProxy.Source, cl.KubeProxy.KC)
	}
	if cl.KubeProxy.Server != "" || !strings.Contains(cl.KubeProxy.ServerFrom, "in-cluster") {
		t.Errorf("server %q from %q; want unknown, in-cluster", cl.KubeProxy.Server, cl.KubeProxy.ServerFrom)
	}
	if cl.KP != nil || cl.KPLayout != defaultLayout {
		t.Errorf("kp's ConfigMap %+v layout %+v; want none, manifests' layout", cl.KP, cl.KPLayout)
	}
}

func TestReadTakesAFlagsOnlyKubeProxy(t *testing.T) {
	c := newTestCluster(t, node("node-1", "10.0.0.1", ""))
	c.create(configMap("kube-proxy", map[string]string{"kubeconfig.conf": kubeconfigFor(kubeProxyServer)}))
	c.create(daemonSet("kube-proxy", []string{"/usr/local/bin/kube-proxy", "--proxy-mode=iptables", "--kubeconfig=/var/lib/kube-proxy/kubeconfig.conf",
		"--cluster-cidr=10.244.0.0/16", "--conntrack-max-per-core=0"},
		v1.VolumeMount{Name: "kube-proxy", MountPath: "/var/lib/kube-proxy"}, configMapVolume("kube-proxy", "kube-proxy")))
	cl := c.read()
	kc := cl.KubeProxy.KC
	if !strings.Contains(cl.KubeProxy.Source, "flags of DaemonSet kube-system/kube-proxy") || kc.ClusterCIDR != "10.244.0.0/16" ||
		kc.Conntrack.MaxPerCore == nil || *kc.Conntrack.MaxPerCore != 0 {
		t.Errorf("from %q: %+v", cl.KubeProxy.Source, kc)
	}
	if cl.KubeProxy.Server != kubeProxyServer || cl.KubeProxy.ServerFrom != "ConfigMap kube-system/kube-proxy, key kubeconfig.conf" {
		t.Errorf("server %q from %q", cl.KubeProxy.Server, cl.KubeProxy.ServerFrom)
	}
}

func TestReadFollowsKPsDaemonSetToItsConfigMap(t *testing.T) {
	c := newTestCluster(t).kubeadm("mode: iptables\n")
	c.create(configMap("kp-custom", map[string]string{"kp.yaml": header + "mode: iptables\nclientConnection: {kubeconfig: /etc/kp/kubeconfig.conf}\n",
		"kubeconfig.conf": kubeconfigFor("https://lb.example:6443")}))
	c.create(daemonSet("kp", []string{"/usr/local/bin/kp", "proxy", "--config=/etc/kp/kp.yaml"},
		v1.VolumeMount{Name: "cfg", MountPath: "/etc/kp"}, configMapVolume("cfg", "kp-custom")))
	cl := c.read()
	if cl.KPLayout.ConfigMap != "kp-custom" || cl.KPLayout.Key != "kp.yaml" || cl.KP == nil || cl.KP.Err != nil {
		t.Fatalf("layout %+v, kp %+v", cl.KPLayout, cl.KP)
	}
	if cl.KP.Server != "https://lb.example:6443" {
		t.Errorf("kp's server %q from %q", cl.KP.Server, cl.KP.ServerFrom)
	}
}

func TestReadSaysWhereKubeProxysConfigIsNot(t *testing.T) {
	c := newTestCluster(t)
	c.create(daemonSet("kube-proxy", []string{"kube-proxy", "--config=/etc/kube-proxy/config.conf"},
		v1.VolumeMount{Name: "host", MountPath: "/etc/kube-proxy"},
		v1.Volume{Name: "host", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/etc/kube-proxy"}}}))
	_, err := Reader{Client: fromclientset.New(c.client), Namespace: "kube-system", KubeProxyDaemonSet: "kube-proxy", KPDaemonSet: "kp"}.Read(context.Background())
	if err == nil || !strings.Contains(err.Error(), "--config /etc/kube-proxy/config.conf is in no ConfigMap volume") {
		t.Fatalf("got %v", err)
	}
}

func TestConfigMapFileMapsItemsAndSubPaths(t *testing.T) {
	spec := &v1.PodSpec{Volumes: []v1.Volume{
		{Name: "a", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "cm-a"},
			Items: []v1.KeyToPath{{Key: "config.conf", Path: "kube-proxy.yaml"}}}}},
		{Name: "b", VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
			{ConfigMap: &v1.ConfigMapProjection{LocalObjectReference: v1.LocalObjectReference{Name: "cm-b"}}}}}}},
	}}
	ctr := &v1.Container{VolumeMounts: []v1.VolumeMount{{Name: "a", MountPath: "/etc/a"}, {Name: "b", MountPath: "/etc/b.conf", SubPath: "b.conf"}}}
	for _, tc := range []struct{ path, name, key string }{
		{"/etc/a/kube-proxy.yaml", "cm-a", "config.conf"},
		{"/etc/b.conf", "cm-b", "b.conf"},
		{"/etc/a/other", "", ""},
		{"/etc/c/x", "", ""},
	} {
		name, key, ok := configMapFile(spec, ctr, tc.path)
		if name != tc.name || key != tc.key || ok != (tc.name != "") {
			t.Errorf("%s: %q %q %v, want %q %q", tc.path, name, key, ok, tc.name, tc.key)
		}
	}
}
