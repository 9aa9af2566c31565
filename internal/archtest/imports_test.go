package archtest

import (
	"encoding/json"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/kpproxy/kp"

type goPackage struct {
	ImportPath string
	Imports    []string
	Standard   bool
}

// packages lists the packages pattern names and every package they
// depend on, with their imports, as go list sees them.
func packages(t *testing.T, pattern string) map[string]goPackage {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-json=ImportPath,Imports,Standard", pattern)
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pattern, err)
	}
	pkgs := map[string]goPackage{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p goPackage
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs[p.ImportPath] = p
	}
	return pkgs
}

// The core is the model and the decisions, no I/O library: what it
// reaches, walking its imports, holds no API client, file watcher, metrics
// library or HTTP. The Kubernetes API types it models (k8s.io/api,
// k8s.io/apimachinery) are not walked into: k8s.io/api/core/v1 itself
// depends on net/http through apimachinery, which the core cannot avoid
// and does not use.
func TestCoreReachesNoIOLibrary(t *testing.T) {
	pkgs := packages(t, "./proxy")
	forbidden := []string{"k8s.io/client-go", "github.com/fsnotify", "github.com/prometheus", "net/http",
		"github.com/google/nftables", "github.com/coreos/go-iptables", "github.com/moby/ipvs", "github.com/ti-mo"}
	typesOnly := []string{"k8s.io/api/", "k8s.io/apimachinery/"}
	seen := map[string][]string{} // package -> how the core reaches it
	var walk func(path string, via []string)
	walk = func(path string, via []string) {
		if _, ok := seen[path]; ok {
			return
		}
		seen[path] = via
		for _, prefix := range typesOnly {
			if strings.HasPrefix(path, prefix) {
				return
			}
		}
		for _, imp := range pkgs[path].Imports {
			walk(imp, append(slices.Clone(via), imp))
		}
	}
	walk(module+"/proxy", nil)
	for path, via := range seen {
		for _, f := range forbidden {
			if path == f || strings.HasPrefix(path, f+"/") {
				t.Errorf("the core reaches %s: proxy → %s", path, strings.Join(via, " → "))
			}
		}
		if strings.HasPrefix(path, module+"/") && path != module+"/proxy" {
			t.Errorf("the core imports kp's %s (via %s): it imports nothing of kp", path, strings.Join(via, " → "))
		}
	}
}

// allowed lists, per package, the kp packages it may import, as docs/layout.md's
// Layout section draws the data flow: sources and servers beside the core,
// backends below it, migrate above the backends, cmd on top. A prefix
// ending in "/" allows everything under it. internal/ is open to all.
var allowed = map[string][]string{
	"proxy":           {},
	"proxy/proxytest": {},
	"proxy/statetest": {"proxy"},
	"proxy/statusapi": {"proxy"},
	"legacy":          {},
	"proxy/source":    {"proxy"},
	"proxy/server":    {"proxy", "proxy/statusapi"},
	// explain: each mode implements explain.RulePather, a packet's path
	// through its own rules, rendered by its own constructors (one
	// constructor path); explain imports the core and conntrack only.
	"nft":             {"proxy", "explain"},
	"legacy/iptables": {"proxy", "explain"},
	"legacy/ipvs":     {"proxy", "legacy/iptables", "explain"},
	// conntrack: a draining userspace proxy hands its UDP flows over by
	// deleting their entries itself (legacy/userspace/handover.go).
	"legacy/userspace": {"proxy", "legacy/iptables", "conntrack", "explain"},
	"conntrack":        {"proxy"},
	// explain: kp top's x opens kp explain's answer.
	"tui":             {"proxy", "proxy/statusapi", "conntrack", "explain"},
	"explain":         {"proxy", "proxy/statusapi", "conntrack"},
	"migrate":         {"proxy", "proxy/statusapi", "nft", "legacy/"},
	"migrate/cluster": {"proxy", "proxy/statusapi"},
	"cmd/kp/options":  {"proxy", "proxy/server", "proxy/source", "nft", "legacy/", "conntrack"},
	// kp migrate cluster --from-kube-proxy's preflight and --print-config:
	// kube-proxy's configuration through options' decoder and merge.
	"cmd/kp/fromkubeproxy": {"proxy", "cmd/kp/options", "conntrack"},
	"cmd/kp":               {""}, // the wiring: everything
}

// No package imports against the data flow; every product package is in
// the table (a new one is placed on purpose).
func TestNoPackageImportsUpward(t *testing.T) {
	pkgs := packages(t, "./...")
	for path, p := range pkgs {
		rel, ok := strings.CutPrefix(path, module+"/")
		if !ok || strings.HasPrefix(rel, "test/") || strings.HasPrefix(rel, "internal/") {
			continue
		}
		rules, ok := allowed[rel]
		if !ok {
			t.Errorf("package %s is not placed in the layout (internal/archtest's allowed table)", rel)
			continue
		}
		for _, imp := range p.Imports {
			dep, ok := strings.CutPrefix(imp, module+"/")
			if !ok || strings.HasPrefix(dep, "internal/") {
				continue
			}
			if strings.HasPrefix(dep, "test/") {
				t.Errorf("%s imports the test harness %s", rel, dep)
				continue
			}
			if !allows(rules, dep) {
				t.Errorf("%s imports %s: against the data flow (allowed: %v)", rel, dep, rules)
			}
		}
	}
}

func allows(rules []string, dep string) bool {
	for _, r := range rules {
		if r == dep || strings.HasSuffix(r, "/") && strings.HasPrefix(dep, r) || r == "" {
			return true
		}
	}
	return false
}

// internal/ packages serve everyone and import no kp package outside
// internal/, so they never close a cycle.
func TestInternalImportsOnlyInternal(t *testing.T) {
	for path, p := range packages(t, "./internal/...") {
		rel, ok := strings.CutPrefix(path, module+"/")
		if !ok || !strings.HasPrefix(rel, "internal/") {
			continue
		}
		for _, imp := range p.Imports {
			if dep, ok := strings.CutPrefix(imp, module+"/"); ok && !strings.HasPrefix(dep, "internal/") {
				t.Errorf("%s imports %s", rel, dep)
			}
		}
	}
}
