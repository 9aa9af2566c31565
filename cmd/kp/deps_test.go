package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/kpproxy/kp/test/netns"
)

// kp's memory is held against upstream kube-proxy's (a third of its peak
// RSS), and some packages cost resident memory in every kp process just by
// being linked, through their package-level state and init work. Measured
// as the idle RSS of kp proxy on the demo manifests:
//   - k8s.io/client-go/kubernetes, the generated clientset of every API
//     group: ~8 MiB (34.0 → 26.2 MiB). kp talks to the API server through
//     internal/kubeclient instead.
//   - k8s.io/kube-proxy/config/v1alpha1, for the --config file's types:
//     ~0.5 MiB (VmHWM 25.8 → 25.2 MiB), through the k8s.io/component-base
//     it links (logs api, featuregate, metrics and legacyregistry, which
//     registers Prometheus collectors at init) and OpenTelemetry. kp decodes
//     into its own mirror (options/kubeproxyconfig.go).
//
// Tests may import them; the binary must not.
var unwantedInBinary = []struct {
	path    string
	subtree bool // every package under path too
	why     string
}{
	{"k8s.io/client-go/kubernetes", true, "the clientset (~8 MiB RSS); use internal/kubeclient"},
	{"k8s.io/kube-proxy/config/v1alpha1", false, "upstream's config types (~0.5 MiB RSS with component-base); use KubeProxyConfiguration in cmd/kp/options/kubeproxyconfig.go"},
	{"k8s.io/component-base", true, "component-base (metrics, featuregate, logs: most of upstream's config types' ~0.5 MiB RSS)"},
}

func TestBinaryDoesNotLinkCostlyPackages(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		netns.Unavailable(t, "skipped: no go command on PATH: %v", err)
	}
	const binary = "github.com/kpproxy/kp/cmd/kp"
	out, err := exec.Command(gobin, "list", "-deps", binary).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list -deps %s: %v\n%s", binary, err, ee.Stderr)
		}
		t.Fatalf("go list -deps %s: %v", binary, err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 50 {
		t.Fatalf("go list -deps %s listed only %d packages: %q", binary, len(deps), deps)
	}
	failed := false
	for _, u := range unwantedInBinary {
		var linked []string
		for _, pkg := range deps {
			if pkg == u.path || u.subtree && strings.HasPrefix(pkg, u.path+"/") {
				linked = append(linked, pkg)
			}
		}
		if len(linked) > 0 {
			failed = true
			t.Errorf("%s links %s: %s", binary, strings.Join(linked, ", "), u.why)
		}
	}
	if failed {
		t.Logf("which package imports them: go list -deps -f '{{.ImportPath}}: {{join .Imports \" \"}}' %s", binary)
	}
}
