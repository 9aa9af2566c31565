package fromkubeproxy

import (
	"context"
	"errors"
	"fmt"
	"path"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/kpproxy/kp/cmd/kp/options"
	"github.com/kpproxy/kp/internal/kubeclient"
)

// Cluster is what the API server says of both proxies and the nodes.
type Cluster struct {
	Namespace string
	// KubeProxy is kube-proxy's configuration.
	KubeProxy *Config
	// KP is kp's ConfigMap's configuration; nil when it does not exist yet.
	KP *Config
	// KPLayout is where kp's DaemonSet reads its files.
	KPLayout Layout
	Nodes    []v1.Node
	// PodSubnet is kubeadm-config's networking.podSubnet ("" without it).
	PodSubnet string
	// Server is the API server's address as the command reached it.
	Server string
}

// Config is one proxy's KubeProxyConfiguration and where it came from.
type Config struct {
	KC     *options.KubeProxyConfiguration
	Source string
	// Lenient is the warning when the file decoded only leniently (as
	// kube-proxy and kp proxy accept it, with that warning).
	Lenient []options.IgnoredSetting
	// Err is set when kp's ConfigMap exists and its file does not decode.
	Err error
	// Server is the API server its kubeconfig (or --master) names, ""
	// when unknown; ServerFrom says where it was read, or why not.
	Server, ServerFrom string
}

// Layout is where kp's DaemonSet reads its configuration: ConfigMap's Key
// mounted at ConfigPath, its kubeconfig at KubeconfigPath (KubeconfigKey).
// manifests/ is the default: ConfigMap kp, /var/lib/kp/config.conf and
// kubeconfig.conf.
type Layout struct {
	ConfigMap, Key                string
	KubeconfigPath, KubeconfigKey string
}

var defaultLayout = Layout{ConfigMap: "kp", Key: "config.conf", KubeconfigPath: "/var/lib/kp/kubeconfig.conf", KubeconfigKey: "kubeconfig.conf"}

// Reader reads a Cluster through the API server.
type Reader struct {
	Client kubeclient.Interface
	// Namespace of both DaemonSets and their ConfigMaps (kube-system).
	Namespace                       string
	KubeProxyDaemonSet, KPDaemonSet string
	// Server is the API server's address as the command reaches it.
	Server string
}

// Read reads both proxies' configurations and the nodes.
func (r Reader) Read(ctx context.Context) (*Cluster, error) {
	c := &Cluster{Namespace: r.Namespace, Server: r.Server}
	dss := r.Client.AppsV1().DaemonSets(r.Namespace)
	ds, err := dss.Get(ctx, r.KubeProxyDaemonSet, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("kube-proxy's DaemonSet %s/%s: %w (--kube-proxy-daemonset names it)", r.Namespace, r.KubeProxyDaemonSet, err)
	}
	if c.KubeProxy, err = r.kubeProxy(ctx, ds); err != nil {
		return nil, err
	}
	kpDS, err := dss.Get(ctx, r.KPDaemonSet, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("kp's DaemonSet %s/%s: %w", r.Namespace, r.KPDaemonSet, err)
	}
	if err != nil {
		kpDS = nil
	}
	c.KPLayout = layoutOf(kpDS)
	if c.KP, err = r.kp(ctx, c.KPLayout); err != nil {
		return nil, err
	}
	nodes, err := r.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	c.Nodes = nodes.Items
	c.PodSubnet = r.podSubnet(ctx)
	return c, nil
}

// kubeProxy reads kube-proxy's configuration as its DaemonSet gives it.
func (r Reader) kubeProxy(ctx context.Context, ds *appsv1.DaemonSet) (*Config, error) {
	spec := &ds.Spec.Template.Spec
	ctr := container(spec, "kube-proxy")
	if ctr == nil {
		return nil, fmt.Errorf("kube-proxy's DaemonSet %s/%s has no container", r.Namespace, ds.Name)
	}
	_, args := containerArgs(ctr)
	a, err := options.ParseKubeProxyArgs(args)
	if err != nil {
		return nil, fmt.Errorf("DaemonSet %s/%s, container %s: %w", r.Namespace, ds.Name, ctr.Name, err)
	}
	cfg := &Config{KC: a.Flags, Source: fmt.Sprintf("the flags of DaemonSet %s/%s (no --config)", r.Namespace, ds.Name)}
	if a.ConfigFile != "" {
		name, key, ok := configMapFile(spec, ctr, a.ConfigFile)
		if !ok {
			return nil, fmt.Errorf("kube-proxy's --config %s is in no ConfigMap volume of DaemonSet %s/%s: the preflight reads it only from one",
				a.ConfigFile, r.Namespace, ds.Name)
		}
		data, src, err := r.configMapKey(ctx, name, key)
		if err != nil {
			return nil, fmt.Errorf("kube-proxy's --config %s: %w", a.ConfigFile, err)
		}
		if cfg.KC, cfg.Lenient, err = options.DecodeKubeProxyConfiguration(data, src); err != nil {
			return nil, err
		}
		cfg.Source = src
	}
	cfg.Server, cfg.ServerFrom = r.server(ctx, spec, ctr, cfg.KC.ClientConnection.Kubeconfig, a.Master)
	return cfg, nil
}

// layoutOf reads where kp's DaemonSet (nil: manifests/) mounts its files.
func layoutOf(ds *appsv1.DaemonSet) Layout {
	l := defaultLayout
	if ds == nil {
		return l
	}
	spec := &ds.Spec.Template.Spec
	ctr := container(spec, "kp")
	if ctr == nil {
		return l
	}
	_, args := containerArgs(ctr)
	a, err := options.ParseKubeProxyArgs(args)
	if err != nil || a.ConfigFile == "" {
		return l
	}
	if name, key, ok := configMapFile(spec, ctr, a.ConfigFile); ok {
		l.ConfigMap, l.Key = name, key
		l.KubeconfigPath = path.Join(path.Dir(a.ConfigFile), defaultLayout.KubeconfigKey)
		if n, k, ok := configMapFile(spec, ctr, l.KubeconfigPath); ok && n == name {
			l.KubeconfigKey = k
		}
	}
	return l
}

// kp reads kp's ConfigMap, nil when it does not exist.
func (r Reader) kp(ctx context.Context, l Layout) (*Config, error) {
	data, src, err := r.configMapKey(ctx, l.ConfigMap, l.Key)
	var nf *notFoundError
	switch {
	case errors.As(err, &nf) && nf.key == "":
		return nil, nil
	case err != nil:
		return &Config{Source: fmt.Sprintf("ConfigMap %s/%s", r.Namespace, l.ConfigMap), Err: err}, nil
	}
	cfg := &Config{Source: src}
	if cfg.KC, cfg.Lenient, cfg.Err = options.DecodeKubeProxyConfiguration(data, src); cfg.Err != nil {
		return cfg, nil
	}
	cfg.Server, cfg.ServerFrom = "", "kp's configuration names no kubeconfig (in-cluster: the kubernetes Service)"
	if p := cfg.KC.ClientConnection.Kubeconfig; p != "" {
		cfg.ServerFrom = "kubeconfig " + p + " is in no key of " + src
		if p == l.KubeconfigPath {
			cfg.Server, cfg.ServerFrom = r.kubeconfigServer(ctx, l.ConfigMap, l.KubeconfigKey)
		}
	}
	return cfg, nil
}

// server is the API server kube-proxy talks to: --master, else its
// kubeconfig's current context's cluster.
func (r Reader) server(ctx context.Context, spec *v1.PodSpec, ctr *v1.Container, kubeconfig, master string) (string, string) {
	switch {
	case master != "":
		return master, "kube-proxy's --master"
	case kubeconfig == "":
		return "", "kube-proxy names no kubeconfig (in-cluster: the kubernetes Service)"
	}
	name, key, ok := configMapFile(spec, ctr, kubeconfig)
	if !ok {
		return "", "kube-proxy's kubeconfig " + kubeconfig + " is in no ConfigMap volume"
	}
	return r.kubeconfigServer(ctx, name, key)
}

func (r Reader) kubeconfigServer(ctx context.Context, name, key string) (string, string) {
	data, src, err := r.configMapKey(ctx, name, key)
	if err != nil {
		return "", err.Error()
	}
	kcfg, err := clientcmd.Load(data)
	if err != nil {
		return "", fmt.Sprintf("%s: %v", src, err)
	}
	cur := kcfg.Contexts[kcfg.CurrentContext]
	if cur == nil || kcfg.Clusters[cur.Cluster] == nil || kcfg.Clusters[cur.Cluster].Server == "" {
		return "", src + ": no server in its current context"
	}
	return kcfg.Clusters[cur.Cluster].Server, src
}

// notFoundError is a ConfigMap (key "") or its key missing.
type notFoundError struct{ namespace, name, key string }

func (e *notFoundError) Error() string {
	if e.key == "" {
		return fmt.Sprintf("ConfigMap %s/%s not found", e.namespace, e.name)
	}
	return fmt.Sprintf("ConfigMap %s/%s has no key %s", e.namespace, e.name, e.key)
}

// configMapKey reads one key of a ConfigMap, and names it for errors.
func (r Reader) configMapKey(ctx context.Context, name, key string) ([]byte, string, error) {
	cm, err := r.Client.CoreV1().ConfigMaps(r.Namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, "", &notFoundError{namespace: r.Namespace, name: name}
	}
	if err != nil {
		return nil, "", fmt.Errorf("ConfigMap %s/%s: %w", r.Namespace, name, err)
	}
	data, ok := cm.Data[key]
	if !ok {
		return nil, "", &notFoundError{namespace: r.Namespace, name: name, key: key}
	}
	return []byte(data), fmt.Sprintf("ConfigMap %s/%s, key %s", r.Namespace, name, key), nil
}

// podSubnet is kubeadm's ClusterConfiguration's networking.podSubnet, the
// controller manager's --cluster-cidr: "" when the cluster has none.
func (r Reader) podSubnet(ctx context.Context) string {
	cm, err := r.Client.CoreV1().ConfigMaps(metav1.NamespaceSystem).Get(ctx, "kubeadm-config", metav1.GetOptions{})
	if err != nil {
		return ""
	}
	var cc struct {
		Networking struct {
			PodSubnet string `json:"podSubnet"`
		} `json:"networking"`
	}
	if yaml.Unmarshal([]byte(cm.Data["ClusterConfiguration"]), &cc) != nil {
		return ""
	}
	return cc.Networking.PodSubnet
}
