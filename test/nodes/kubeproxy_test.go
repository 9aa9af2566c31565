package nodes

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kpproxy/kp/test/apiserver"
	"github.com/kpproxy/kp/test/cluster"
	"github.com/kpproxy/kp/test/image"
)

// kubeProxyRef is upstream kube-proxy's image: the binary the tests build
// (test/k8s, v1.36.3) on kp's image's Debian userland (iptables of both
// backends), as a user's kube-proxy image has it, built the same way
// without a daemon.
const kubeProxyRef = "kp.local/kube-proxy:e2e"

func kubeProxyImage(t *testing.T) image.Image {
	t.Helper()
	img := cluster.KPImage(t, apiserver.Bin(t, apiserver.KubeProxy), kubeProxyRef)
	img.Layers = [][]image.Entry{img.Layers[0], {{Path: "/usr/local/bin/kube-proxy", Source: apiserver.Bin(t, apiserver.KubeProxy), Mode: 0o755}}}
	img.Entrypoint, img.Cmd = []string{"/usr/local/bin/kube-proxy"}, nil
	return img
}

// kubeProxyManifest is upstream kube-proxy as a DaemonSet, as kubeadm
// deploys it (hostNetwork, privileged, the system:node-proxier role, its
// configuration in ConfigMap kube-proxy's config.conf, read with --config),
// in iptables mode, reaching the API server at its real address
// (kubeconfig.conf) with its service account's token.
func kubeProxyManifest(c *cluster.Cluster) string {
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
`, c.ClusterCIDR, c.API.Instance(0).Addr, kubeProxyRef)
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
