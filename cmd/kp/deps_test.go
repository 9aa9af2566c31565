package main

import (
	"os/exec"
	"path/filepath"
	"strconv"
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

// go-runewidth v0.0.23 to v0.0.27 build their width tables at init (41 ms
// of CPU and 2.4 MiB resident in every kp process, the node proxy included:
// test/bench/NOTES.md); v0.0.28 on build them on first use, by kp top alone.
// kp requires a lazy release rather than replacing the module, since `go
// install` refuses a module whose go.mod has a replace directive
// (test/goinstall).
func TestBinaryLinksARuneWidthThatBuildsItsTablesLazily(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		netns.Unavailable(t, "skipped: no go command on PATH: %v", err)
	}
	const mod = "github.com/mattn/go-runewidth"
	out, err := exec.Command(gobin, "list", "-m", mod).Output()
	if err != nil {
		t.Fatalf("go list -m %s: %v", mod, err)
	}
	// "path version", or "path version => path version" when replaced: the
	// last version is the one built.
	fields := strings.Fields(string(out))
	if len(fields) < 2 {
		t.Fatalf("go list -m %s: %q", mod, out)
	}
	version := fields[len(fields)-1]
	patch, err := strconv.Atoi(strings.TrimPrefix(version, "v0.0."))
	if err != nil {
		t.Fatalf("%s %s: not a v0.0.N release (%v); check whether it builds tables at init, then update this test", mod, version, err)
	}
	if patch >= 23 && patch <= 27 {
		t.Errorf("kp builds with %s %s, which builds its width tables at init in every kp process; require v0.0.28 or later", mod, version)
	}
	if len(fields) > 2 {
		t.Errorf("go.mod replaces %s (%s): go install refuses a module with a replace directive", mod, strings.TrimSpace(string(out)))
	}
}

// A reachable text/template executor (cobra's Set*Template, for one) makes
// the linker keep every exported method of every type in the binary, since
// the template calls methods by name: at 1c2a00b kp's usage template cost
// 4.8 MB of text and ~3.5 MiB of every kp process's RSS (test/bench/NOTES.md,
// "The regression gate"). kp appends to cobra's usage with a UsageFunc.
func TestBinaryDoesNotLinkTheTemplateExecutor(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		netns.Unavailable(t, "skipped: no go command on PATH: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "kp")
	if out, err := exec.Command(gobin, "build", "-o", bin, "github.com/kpproxy/kp/cmd/kp").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	syms, err := exec.Command(gobin, "tool", "nm", bin).Output()
	if err != nil {
		t.Fatalf("go tool nm: %v", err)
	}
	const executor = "text/template.(*state).evalCall"
	for _, line := range strings.Split(string(syms), "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[len(f)-1] == executor {
			t.Fatalf("kp links %s: a text/template is executed somewhere (cobra's SetUsageTemplate, SetHelpTemplate, "+
				"SetVersionTemplate...), which keeps every exported method in the binary; write a func instead", executor)
		}
	}
}
