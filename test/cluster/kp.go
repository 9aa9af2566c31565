package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpproxy/kp/proxy/statusapi"
	"github.com/kpproxy/kp/test/netns"
)

// KPOption changes what KPOverlay sets.
type KPOption func(*kpOverlay)

type kpOverlay struct {
	mode string
	args []string
}

// KPMode runs kp in mode (the config file's mode: field) instead of the
// manifests' nftables.
func KPMode(mode string) KPOption { return func(o *kpOverlay) { o.mode = mode } }

// KPArgs adds flags to the kp container's command (kp proxy), as an
// operator would: --allow-mode-none for kp migrate cluster's hand-back to
// kube-proxy.
func KPArgs(args ...string) KPOption { return func(o *kpOverlay) { o.args = append(o.args, args...) } }

// KPOverlay writes a kustomization that takes the repository's manifests/
// as they are and sets what a user sets for their cluster: the image
// (kp.local/kp:imageTag), the cluster's pod range and the API server's
// address, and the mode and extra flags when options say so. It returns its
// folder, for kubectl apply -k.
func (c *Cluster) KPOverlay(imageTag string, opts ...KPOption) (string, error) {
	var o kpOverlay
	for _, opt := range opts {
		opt(&o)
	}
	root, err := netns.ModuleRoot()
	if err != nil {
		return "", err
	}
	manifests := filepath.Join(root, "manifests")
	cm, err := os.ReadFile(filepath.Join(manifests, "configmap.yaml"))
	if err != nil {
		return "", err
	}
	// The ConfigMap's two files with the cluster's values, replaced whole
	// by a strategic merge patch (JSON is YAML).
	config, err := configMapFile(string(cm), "config.conf")
	if err != nil {
		return "", err
	}
	kubeconfig, err := configMapFile(string(cm), "kubeconfig.conf")
	if err != nil {
		return "", err
	}
	if !strings.Contains(config, "clusterCIDR: CLUSTER-POD-CIDRS") || !strings.Contains(kubeconfig, "CONTROL-PLANE-ENDPOINT:6443") {
		return "", fmt.Errorf("manifests/configmap.yaml changed shape: no clusterCIDR: CLUSTER-POD-CIDRS or CONTROL-PLANE-ENDPOINT:6443 to set")
	}
	config = strings.Replace(config, "clusterCIDR: CLUSTER-POD-CIDRS", fmt.Sprintf("clusterCIDR: %q", c.ClusterCIDR), 1)
	// A test node is a network namespace, where the kernel lets only the
	// initial namespace set nf_conntrack_max: leave the table's size, as
	// the upstream kube-proxy of these tests does (conntrack.maxPerCore: 0).
	if !strings.Contains(config, "maxPerCore: 32768") {
		return "", fmt.Errorf("manifests/configmap.yaml changed shape: no conntrack maxPerCore: 32768 to set to 0")
	}
	config = strings.Replace(config, "maxPerCore: 32768", "maxPerCore: 0", 1)
	if o.mode != "" {
		if !strings.Contains(config, "\nmode: nftables\n") {
			return "", fmt.Errorf("manifests/configmap.yaml changed shape: no mode: nftables to set to %s", o.mode)
		}
		config = strings.Replace(config, "\nmode: nftables\n", "\nmode: "+o.mode+"\n", 1)
	}
	kubeconfig = strings.Replace(kubeconfig, "CONTROL-PLANE-ENDPOINT:6443", c.API.Instance(0).Addr.String(), 1)
	patch, _ := json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "kp", "namespace": "kube-system"},
		"data":     map[string]string{"config.conf": config, "kubeconfig.conf": kubeconfig},
	})
	dir, err := os.MkdirTemp(c.dir, "kp-overlay-*")
	if err != nil {
		return "", err
	}
	rel, err := filepath.Rel(dir, manifests)
	if err != nil {
		return "", err
	}
	kustomization := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - %s
images:
  - name: ghcr.io/kpproxy/kp
    newName: kp.local/kp
    newTag: %s
patches:
  - patch: '%s'
`, rel, imageTag, strings.ReplaceAll(string(patch), "'", "''"))
	if len(o.args) > 0 {
		// A JSON patch (JSON is YAML) appending to the proxy container's
		// command, the DaemonSet's first container.
		var ops []map[string]string
		for _, a := range o.args {
			ops = append(ops, map[string]string{"op": "add", "path": "/spec/template/spec/containers/0/command/-", "value": a})
		}
		argsPatch, _ := json.Marshal(ops)
		kustomization += fmt.Sprintf("  - target: {kind: DaemonSet, name: kp}\n    patch: '%s'\n",
			strings.ReplaceAll(string(argsPatch), "'", "''"))
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kustomization), 0o644); err != nil {
		return "", err
	}
	return dir, nil
}

// configMapFile cuts one file (a block scalar under data:) out of a
// ConfigMap's YAML, without its indentation.
func configMapFile(yaml, name string) (string, error) {
	_, rest, ok := strings.Cut(yaml, "\n  "+name+": |\n")
	if !ok {
		return "", fmt.Errorf("manifests/configmap.yaml: no data %s", name)
	}
	var b strings.Builder
	for _, l := range strings.Split(rest, "\n") {
		if l != "" && !strings.HasPrefix(l, "    ") {
			break
		}
		b.WriteString(strings.TrimPrefix(l, "    ") + "\n")
	}
	return strings.TrimRight(b.String(), "\n") + "\n", nil
}

// DeployKP applies manifests/ with the image kp.local/kp:imageTag (see
// KPOverlay) and waits until the DaemonSet runs a Ready kp pod of that
// image on every node.
func (c *Cluster) DeployKP(imageTag string, timeout time.Duration, opts ...KPOption) error {
	dir, err := c.KPOverlay(imageTag, opts...)
	if err != nil {
		return err
	}
	if out, err := c.Kubectl("apply", "-k", dir); err != nil {
		return fmt.Errorf("kubectl apply -k (manifests/ with the test's image and addresses): %w\n%s", err, out)
	}
	return c.WaitKP("kp.local/kp:"+imageTag, timeout)
}

// WaitKP waits until the DaemonSet runs one Ready kp pod of image on every
// node, and no other kp pod.
func (c *Cluster) WaitKP(image string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last string
	err := poll(ctx, func() (bool, error) {
		pods, err := c.Client().CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kp"})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		var state []string
		ready := map[string]bool{}
		for _, p := range pods.Items {
			ok := p.DeletionTimestamp == nil && p.Spec.Containers[0].Image == image && PodReady(&p)
			state = append(state, fmt.Sprintf("%s on %s: %s %s ready=%v deleting=%v", p.Name, p.Spec.NodeName,
				p.Spec.Containers[0].Image, p.Status.Phase, PodReady(&p), p.DeletionTimestamp != nil))
			if ok {
				ready[p.Spec.NodeName] = true
			}
		}
		last = fmt.Sprintf("%d pods: %s", len(pods.Items), strings.Join(state, "; "))
		return len(ready) == len(c.Nodes) && len(pods.Items) == len(c.Nodes), nil
	})
	if err != nil {
		return fmt.Errorf("waiting %v for a Ready kp pod with image %s on every node: %w; still: %s", timeout, image, err, last)
	}
	return nil
}

// PodReady says whether p's Ready condition is true.
func PodReady(p *v1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == v1.PodReady {
			return cond.Status == v1.ConditionTrue
		}
	}
	return false
}

// KPStatusSocket is the path, from this (the host's) mount namespace, of
// the status socket of the kp proxy running in a pod on n: kp serves its
// status API on a Unix socket in its pod's emptyDir, which root reaches
// through the process's root (/proc/PID/root), as an operator on the node
// does. The kp process is found in n's kubepods cgroup.
func (n *Node) KPStatusSocket() (string, error) {
	for _, pid := range cgroupPids(n.CgroupRoot() + "/kubepods") {
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if len(args) < 2 || filepath.Base(args[0]) != "kp" || args[1] != "proxy" {
			continue
		}
		socket := statusapi.DefaultSocket
		for i, a := range args {
			if v, ok := strings.CutPrefix(a, "--status-socket="); ok {
				socket = v
			} else if a == "--status-socket" && i+1 < len(args) {
				socket = args[i+1]
			}
		}
		return fmt.Sprintf("/proc/%d/root%s", pid, socket), nil
	}
	return "", fmt.Errorf("node %s: no kp proxy process in its pods", n.Name)
}
