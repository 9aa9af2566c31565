package options

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kpproxy/kp/test/netns"
)

// TestUpstreamFactsAreThePinnedModules regenerates upstream_gen.go from the
// k8s.io/kubernetes module test/k8s pins (its kube-proxy command's flags,
// its feature gate registry) and fails on any difference: kp's list of
// upstream's flags and gates is upstream's own, never a hand copy. It builds
// upstream's kube-proxy packages (shared with make kube-bins' build cache:
// about a minute when warm).
func TestUpstreamFactsAreThePinnedModules(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		netns.Unavailable(t, "skipped: no go command on PATH: %v", err)
	}
	cmd := exec.Command(gobin, "run", "-trimpath", "./cmd/kube-proxy-facts")
	cmd.Dir = filepath.Join("..", "..", "..", "test", "k8s")
	// The flags build.sh builds kube-proxy with, so the build cache serves
	// both.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	got, err := cmd.Output()
	if err != nil {
		t.Fatalf("go run ./cmd/kube-proxy-facts in test/k8s: %v\n%s", err, stderr.String())
	}
	want, err := os.ReadFile("upstream_gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		gotLines, wantLines := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		for i := 0; i < len(gotLines) || i < len(wantLines); i++ {
			g, w := line(gotLines, i), line(wantLines, i)
			if g != w {
				t.Fatalf("upstream_gen.go is not what the pinned module gives; run go generate ./cmd/kp/options "+
					"and follow up the tests that fail. First difference, line %d:\n module: %s\n   file: %s", i+1, g, w)
			}
		}
	}
}

func line(lines []string, i int) string {
	if i < len(lines) {
		return lines[i]
	}
	return "(end of file)"
}

// TestGateChecksFollowTheGeneratedRegistry holds resolveFeatureGates to the
// registry's facts, gate by gate: every gate upstream knows is accepted at
// its default, a locked one refused at the other value, the rest accepted
// at either value unless a dependency is off.
func TestGateChecksFollowTheGeneratedRegistry(t *testing.T) {
	if len(upstreamGates) < 100 {
		t.Fatalf("only %d gates in upstream_gen.go", len(upstreamGates))
	}
	for name, g := range upstreamGates {
		if _, err := resolveFeatureGates(map[string]bool{name: g.def}); err != nil {
			t.Errorf("%s=%t (its default): %v", name, g.def, err)
		}
		_, err := resolveFeatureGates(map[string]bool{name: !g.def})
		switch {
		case g.locked && err == nil:
			t.Errorf("%s=%t accepted; it is locked to %t", name, !g.def, g.def)
		case !g.locked && err != nil && !strings.Contains(err.Error(), "depends on features that are disabled"):
			t.Errorf("%s=%t: %v", name, !g.def, err)
		}
	}
	for _, name := range []string{"APIResponseCompression", "ContextualLogging", "WatchListClient"} {
		if _, ok := upstreamGates[name]; !ok {
			t.Errorf("upstream's gate %s is not in the registry", name)
		}
	}
}
