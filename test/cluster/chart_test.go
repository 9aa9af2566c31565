package cluster

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The real-node test's Helm install is the README's command with the
// cluster's values in place of the README's, each of them, and no other
// value: a README that sets another one, or leaves one out, fails here
// before any cluster starts.
func TestKPChartFollowsTheReadmesHelmInstall(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	ours := map[string]string{"apiServer": "https://10.250.0.1:6443", "clusterCIDR": "10.251.0.0/16",
		"image.repository": "kp.local/kp", "image.tag": "e2e"}
	got, err := chartArgs(string(readme), ours, kpOverlay{mode: "iptables", args: []string{"--allow-mode-none"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"template", "kp", "./charts/kp", "--namespace", "kube-system", "--set", "apiServer=https://10.250.0.1:6443",
		"--set", "clusterCIDR=10.251.0.0/16", "--set", "image.repository=kp.local/kp", "--set", "image.tag=e2e",
		"--set", "conntrack.maxPerCore=0", "--set", "mode=iptables", "--set", "extraArgs[0]=--allow-mode-none"}
	if !slices.Equal(got, want) {
		t.Errorf("kp-chart %q\nwant     %q", got, want)
	}

	line := readmeInstall + "--namespace kube-system --set apiServer=https://10.0.0.10:6443 \\\n  --set clusterCIDR=10.244.0.0/16 --set image.repository=r --set image.tag=t"
	for _, tc := range []struct{ name, readme, want string }{
		{"another value", line + " --set mode=iptables\n", "sets mode: the real-node test has no value"},
		{"a value left out", strings.Replace(line, " --set image.tag=t", "", 1) + "\n", "does not set image.tag"},
		{"another flag", line + " --wait\n", `"--wait"`},
		{"no helm install", "helm upgrade --install kp ./charts/kp\n", "no line starting"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := chartArgs("\n"+tc.readme, ours, kpOverlay{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v, want an error with %q", err, tc.want)
			}
		})
	}
}
