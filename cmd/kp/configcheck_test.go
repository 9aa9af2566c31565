package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// shippedConfigMap writes manifests/configmap.yaml's two files into a
// folder, as the DaemonSet mounts them at /var/lib/kp (the kubeconfig's
// path moved there), each edited by its function, and returns config.conf's
// path.
func shippedConfigMap(t *testing.T, editConfig, editKubeconfig func(string) string) string {
	t.Helper()
	data, err := os.ReadFile("../../manifests/configmap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cm v1.ConfigMap
	if err := yaml.UnmarshalStrict(data, &cm); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	config := strings.ReplaceAll(cm.Data["config.conf"], "/var/lib/kp/", dir+"/")
	for name, content := range map[string]string{"config.conf": editConfig(config), "kubeconfig.conf": editKubeconfig(cm.Data["kubeconfig.conf"])} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "config.conf")
}

func same(s string) string { return s }

func podCIDRs(cidr string) func(string) string {
	return func(s string) string {
		return strings.Replace(s, "clusterCIDR: CLUSTER-POD-CIDRS", "clusterCIDR: "+cidr, 1)
	}
}

func realServer(s string) string {
	return strings.Replace(s, "https://CONTROL-PLANE-ENDPOINT:6443", "https://10.0.0.10:6443", 1)
}

func TestKpRefusesToStartOnTheShippedConfigMapsPlaceholdersNamingFieldAndKey(t *testing.T) {
	for _, tc := range []struct {
		name         string
		config, kube func(string) string
		args         []string // before --config
		want         []string // in stderr
	}{
		{"the clusterCIDR placeholder", same, same, []string{"proxy"},
			[]string{`clusterCIDR "CLUSTER-POD-CIDRS": still manifests/configmap.yaml's placeholder`, "key config.conf"}},
		{"the clusterCIDR placeholder, in the init container", same, realServer, []string{"sysctl"},
			[]string{`clusterCIDR "CLUSTER-POD-CIDRS": still manifests/configmap.yaml's placeholder`, "key config.conf"}},
		{"the API server placeholder", podCIDRs("10.244.0.0/16"), same, []string{"proxy"},
			[]string{"the API server's address is still manifests/configmap.yaml's placeholder (server: https://CONTROL-PLANE-ENDPOINT:6443)", "key kubeconfig.conf"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			path := shippedConfigMap(t, tc.config, tc.kube)
			code := h.run(append(tc.args, "--config", path, "--hostname-override", "node-a")...)
			if code != exitFailed || h.ran || len(h.kubeCalls) > 0 {
				t.Errorf("exit %d, ran %v, API clients %v; want exit 1 before reaching for the API server", code, h.ran, h.kubeCalls)
			}
			for _, want := range tc.want {
				if !strings.Contains(h.stderr.String(), want) {
					t.Errorf("stderr lacks %q:\n%s", want, h.stderr.String())
				}
			}
		})
	}
}

func TestKpStartsOnTheConfigMapFilledIn(t *testing.T) {
	for _, tc := range []struct {
		name, cidr string
		warned     bool
	}{
		{"pod CIDRs", "10.244.0.0/16,fd00:10:244::/56", false},
		// As kube-proxy (EKS runs it so): a warning, and kp runs.
		{"an empty clusterCIDR", `""`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			code := h.run("proxy", "--config", shippedConfigMap(t, podCIDRs(tc.cidr), realServer), "--hostname-override", "node-a")
			if code != 0 || !h.ran {
				t.Fatalf("exit %d, ran %v: %s", code, h.ran, h.stderr.String())
			}
			warned := strings.Contains(h.stderr.String(), `"clusterCIDR is empty (--cluster-cidr): with detectLocalMode ClusterCIDR kp cannot tell pods from other clients`)
			if warned != tc.warned {
				t.Errorf("warned about an empty clusterCIDR: %v, want %v:\n%s", warned, tc.warned, h.stderr.String())
			}
		})
	}
}
