package conformance

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kpproxy/kp/test/cluster"
)

// dnsManifest is the cluster DNS as kube-dns in kube-system: CoreDNS with
// the cached Corefile (cluster names only, no forward: nothing leaves the
// machine), two replicas, at the kubelets' clusterDNS address. %[1]s is the
// Corefile (indented), %[2]s the image, %[3]s the Service's address.
const dnsManifest = `apiVersion: v1
kind: ServiceAccount
metadata:
  name: coredns
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:coredns
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
metadata:
  name: system:coredns
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:coredns
subjects:
  - kind: ServiceAccount
    name: coredns
    namespace: kube-system
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: coredns
  namespace: kube-system
data:
  Corefile: |
%[1]s
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  replicas: 2
  selector:
    matchLabels: {k8s-app: kube-dns}
  template:
    metadata:
      labels: {k8s-app: kube-dns}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      topologySpreadConstraints:
        - maxSkew: 1
          topologyKey: kubernetes.io/hostname
          whenUnsatisfiable: ScheduleAnyway
          labelSelector:
            matchLabels: {k8s-app: kube-dns}
      containers:
        - name: coredns
          image: %[2]s
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
            periodSeconds: 2
      volumes:
        - name: config
          configMap: {name: coredns}
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  selector: {k8s-app: kube-dns}
  clusterIP: %[3]s
  ports:
    - {name: dns, port: 53, protocol: UDP}
    - {name: dns-tcp, port: 53, protocol: TCP}
`

// deployDNS deploys the cluster DNS and waits until both replicas are
// ready: they reach the API server through the kubernetes Service, so the
// node proxy must work for that.
func deployDNS(t *testing.T, c *cluster.Cluster, art artifacts) {
	corefile, err := os.ReadFile(art.corefile)
	if err != nil {
		t.Fatal(err)
	}
	var indented []string
	for _, l := range strings.Split(strings.TrimRight(string(corefile), "\n"), "\n") {
		indented = append(indented, "    "+l)
	}
	manifest := fmt.Sprintf(dnsManifest, strings.Join(indented, "\n"), art.coredns, cluster.ClusterDNS)
	f := filepath.Join(t.TempDir(), "dns.yaml")
	if err := os.WriteFile(f, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := c.Kubectl("apply", "-f", f); err != nil {
		t.Fatalf("kubectl apply (cluster DNS): %v\n%s", err, out)
	}
	if out, err := c.Kubectl("rollout", "status", "-n", "kube-system", "deployment/coredns", "--timeout=3m"); err != nil {
		logs, _ := c.Kubectl("logs", "-n", "kube-system", "-l", "k8s-app=kube-dns", "--tail=30")
		t.Fatalf("cluster DNS not ready: %v\n%s\n%s", err, out, logs)
	}
}
