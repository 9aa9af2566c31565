package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/test/images"
)

// DNSOptions shape the cluster DNS DeployDNS runs.
type DNSOptions struct {
	// Replicas is the number of CoreDNS pods (default 1), spread over the
	// nodes when there are several.
	Replicas int
	// Node pins every replica to the node of that name; empty lets the
	// scheduler choose.
	Node string
	// Timeout bounds the wait for every replica to be ready (default 3
	// minutes).
	Timeout time.Duration
}

// dnsManifest is the cluster DNS as kubeadm sets it up, in kube-system:
// CoreDNS (the test image) with the cached Corefile in a ConfigMap
// (cluster names only, no forward: nothing leaves the machine) behind the
// kube-dns Service at the kubelets' clusterDNS address. The placeholders
// are replaced by DeployDNS.
const dnsManifest = `apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
  - apiGroups: [""]
    resources: [endpoints, services, pods, namespaces]
    verbs: [list, watch]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects:
  - {kind: ServiceAccount, name: coredns, namespace: kube-system}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
COREFILE
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: REPLICAS
  selector:
    matchLabels: {k8s-app: kube-dns}
  template:
    metadata:
      labels: {k8s-app: kube-dns}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      NODE_SELECTOR
      topologySpreadConstraints:
        - maxSkew: 1
          topologyKey: kubernetes.io/hostname
          whenUnsatisfiable: ScheduleAnyway
          labelSelector:
            matchLabels: {k8s-app: kube-dns}
      containers:
        - name: coredns
          image: IMAGE
          imagePullPolicy: Never
          args: ["-conf", "/etc/coredns/Corefile"]
          ports:
            - {name: dns, containerPort: 53, protocol: UDP}
            - {name: dns-tcp, containerPort: 53, protocol: TCP}
          volumeMounts:
            - {name: config, mountPath: /etc/coredns, readOnly: true}
          livenessProbe:
            httpGet: {path: /health, port: 8080}
          readinessProbe:
            httpGet: {path: /ready, port: 8181}
            periodSeconds: 1
      volumes:
        - name: config
          configMap: {name: coredns}
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  selector: {k8s-app: kube-dns}
  clusterIP: CLUSTER_DNS
  ports:
    - {name: dns, port: 53, protocol: UDP}
    - {name: dns-tcp, port: 53, protocol: TCP}
`

// DeployDNS runs the cluster DNS: it imports the CoreDNS image
// (images.CoreDNS) into every node, applies the Deployment coredns and the
// Service kube-dns in kube-system, and waits until every replica is ready.
// The replicas reach the API server through the kubernetes Service, so
// the node proxy must already work. It returns the Service's address,
// ClusterDNS, where the kubelets point pods. It skips t when the images
// are not built (fails it under CI).
func DeployDNS(t testing.TB, c *Cluster, opts DNSOptions) string {
	t.Helper()
	if opts.Replicas <= 0 {
		opts.Replicas = 1
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 3 * time.Minute
	}
	img := images.Get(t, images.CoreDNS)
	corefile, err := os.ReadFile(images.Corefile(t))
	if err != nil {
		t.Fatalf("cluster DNS: %v", err)
	}
	for _, n := range c.Nodes {
		if err := n.ImportImages(img.Tarball); err != nil {
			t.Fatalf("cluster DNS: %v", err)
		}
	}
	var indented []string
	for _, l := range strings.Split(strings.TrimRight(string(corefile), "\n"), "\n") {
		indented = append(indented, "    "+l)
	}
	nodeSelector := ""
	if opts.Node != "" {
		nodeSelector = fmt.Sprintf("nodeSelector: {kubernetes.io/hostname: %s}", opts.Node)
	}
	manifest := strings.NewReplacer(
		"COREFILE", strings.Join(indented, "\n"),
		"REPLICAS", fmt.Sprint(opts.Replicas),
		"NODE_SELECTOR", nodeSelector,
		"IMAGE", img.Ref,
		"CLUSTER_DNS", ClusterDNS,
	).Replace(dnsManifest)
	f := filepath.Join(c.dir, "dns.yaml")
	if err := os.WriteFile(f, []byte(manifest), 0o644); err != nil {
		t.Fatalf("cluster DNS: %v", err)
	}
	if out, err := c.Kubectl("apply", "-f", f); err != nil {
		t.Fatalf("cluster DNS: kubectl apply: %v\n%s", err, out)
	}
	start := time.Now()
	if out, err := c.Kubectl("rollout", "status", "-n", "kube-system", "deployment/coredns",
		fmt.Sprintf("--timeout=%s", opts.Timeout)); err != nil {
		logs, _ := c.Kubectl("logs", "-n", "kube-system", "-l", "k8s-app=kube-dns", "--tail=30")
		t.Fatalf("cluster DNS: CoreDNS not ready after %v: %v\n%s\n%s", time.Since(start).Round(time.Second), err, out, logs)
	}
	t.Logf("cluster DNS: %d CoreDNS ready in %v, kube-dns at %s", opts.Replicas, time.Since(start).Round(100*time.Millisecond), ClusterDNS)
	return ClusterDNS
}
