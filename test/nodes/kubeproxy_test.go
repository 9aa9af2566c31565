package nodes

import (
	"fmt"
	"io/fs"
	"strings"
	"testing"

	"github.com/kpproxy/kp/test/apiserver"
	"github.com/kpproxy/kp/test/cluster"
	"github.com/kpproxy/kp/test/image"
)

// kubeProxyRef is upstream kube-proxy's image for nodes whose iptables is
// backend ("nft" or "legacy"): the binary the tests build (test/k8s,
// v1.36.3) on kp's image's Debian userland (iptables of both backends), as
// a user's kube-proxy image has it, built the same way without a daemon.
func kubeProxyRef(backend string) string { return "kp.local/kube-proxy:e2e-" + backend }

// kubeProxyImage is kubeProxyRef(backend). Upstream's binary runs
// `iptables`, and upstream's image points that at the node's backend
// (iptables-wrapper, from kubelet's chains); here the image's alternative
// is set to backend, which the test knows.
func kubeProxyImage(t *testing.T, backend string) image.Image {
	t.Helper()
	img := cluster.KPImage(t, apiserver.Bin(t, apiserver.KubeProxy), kubeProxyRef(backend))
	top := []image.Entry{{Path: "/usr/local/bin/kube-proxy", Source: apiserver.Bin(t, apiserver.KubeProxy), Mode: 0o755}}
	for _, tool := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			top = append(top, image.Entry{Path: "/usr/sbin/" + tool + suffix, Mode: fs.ModeSymlink | 0o777, Link: tool + "-" + backend + suffix})
		}
	}
	img.Layers = [][]image.Entry{img.Layers[0], top}
	img.Entrypoint, img.Cmd = []string{"/usr/local/bin/kube-proxy"}, nil
	return img
}

// kubeProxyManifest is upstream kube-proxy as a DaemonSet, as kubeadm
// deploys it (hostNetwork, privileged, the system:node-proxier role, its
// configuration in ConfigMap kube-proxy's config.conf, read with --config),
// in iptables mode, reaching the API server at its real address
// (kubeconfig.conf) with its service account's token; its image is ref.
func kubeProxyManifest(c *cluster.Cluster, ref string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: ServiceAccount
metadata:
  name: kube-proxy
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: kube-proxy
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:node-proxier
subjects:
  - kind: ServiceAccount
    name: kube-proxy
    namespace: kube-system
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: kube-proxy
  namespace: kube-system
data:
  config.conf: |
    apiVersion: kubeproxy.config.k8s.io/v1alpha1
    kind: KubeProxyConfiguration
    mode: iptables
    clusterCIDR: %s
    clientConnection:
      kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
    conntrack:
      maxPerCore: 0
  kubeconfig.conf: |
    apiVersion: v1
    kind: Config
    clusters:
      - name: default
        cluster:
          server: https://%s
          certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
    users:
      - name: default
        user:
          tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
    contexts:
      - name: default
        context: {cluster: default, user: default}
    current-context: default
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: kube-proxy
  namespace: kube-system
  labels: {k8s-app: kube-proxy}
spec:
  selector:
    matchLabels: {k8s-app: kube-proxy}
  updateStrategy:
    type: RollingUpdate
    rollingUpdate: {maxUnavailable: 1}
  template:
    metadata:
      labels: {k8s-app: kube-proxy}
    spec:
      serviceAccountName: kube-proxy
      hostNetwork: true
      priorityClassName: system-node-critical
      terminationGracePeriodSeconds: 5
      tolerations: [{operator: Exists}]
      containers:
        - name: kube-proxy
          image: %s
          imagePullPolicy: Never
          command:
            - /usr/local/bin/kube-proxy
            - --config=/var/lib/kube-proxy/config.conf
            - --hostname-override=$(NODE_NAME)
          env:
            - name: NODE_NAME
              valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
          securityContext: {privileged: true}
          volumeMounts:
            - {name: kube-proxy, mountPath: /var/lib/kube-proxy}
            - {name: xtables-lock, mountPath: /run/xtables.lock}
      volumes:
        - name: kube-proxy
          configMap: {name: kube-proxy}
        - name: xtables-lock
          hostPath: {path: /run/xtables.lock, type: FileOrCreate}
`, c.ClusterCIDR, c.API.Instance(0).Addr, ref)
}

// kubeletChains are the KUBE- chains kubelet makes: not kube-proxy's.
var kubeletChains = []string{"KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT", "KUBE-MARK-DROP"}

// kubeProxyChains lists the KUBE- chains of both iptables backends in n
// but kubelet's.
func kubeProxyChains(n *cluster.Node) ([]string, error) {
	var out []string
	for _, save := range []string{"iptables-nft-save", "iptables-legacy-save"} {
		dump, err := n.Exec(save)
		if err != nil {
			return nil, err
		}
		for _, l := range strings.Split(dump, "\n") {
			name, ok := strings.CutPrefix(l, ":KUBE-")
			if !ok {
				continue
			}
			name, _, _ = strings.Cut("KUBE-"+name, " ")
			kubelet := false
			for _, k := range kubeletChains {
				kubelet = kubelet || name == k
			}
			if !kubelet {
				out = append(out, save+" "+name)
			}
		}
	}
	return out, nil
}

// checkNodeBackend checks that the node's iptables is backend as the test
// set it up: kubelet's hint chain, and every chain of kube-proxy's, are in
// that backend's tables.
func checkNodeBackend(t *testing.T, n *cluster.Node, backend string) {
	t.Helper()
	save := "iptables-" + backend + "-save"
	dump, err := n.Exec(save, "-t", "mangle")
	if err != nil || !strings.Contains(dump, ":KUBE-IPTABLES-HINT ") {
		t.Fatalf("%s: kubelet's KUBE-IPTABLES-HINT is not in %s (%v)", n.Name, save, err)
	}
	chains, err := kubeProxyChains(n)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range chains {
		if !strings.HasPrefix(c, save+" ") {
			t.Errorf("%s: kube-proxy's chain %s, want every one in %s", n.Name, c, save)
		}
	}
}
