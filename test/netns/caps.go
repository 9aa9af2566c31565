package netns

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// WithoutCapability puts, first on the PATH for the rest of t, a wrapper of
// each binary that runs the real one without capability capName
// ("net_raw"), as a container whose securityContext does not add it: the
// capability is dropped from the bounding set, so root's exec of the real
// binary does not get it back. Each binary must be on the PATH; the test
// cannot run in parallel (it sets PATH). calls lists the wrapped binaries
// run since, one line each: the binary's name and its arguments.
func WithoutCapability(t testing.TB, capName string, binaries ...string) (calls func() []string) {
	t.Helper()
	Require(t, append([]string{"setpriv"}, binaries...)...)
	dir := t.TempDir()
	log := filepath.Join(dir, "calls")
	for _, bin := range binaries {
		real, err := exec.LookPath(bin)
		if err != nil {
			t.Fatal(err)
		}
		script := "#!/bin/sh\necho \"" + bin + ` $*" >>` + log + "\n" +
			"exec setpriv --inh-caps=-all --bounding-set=-" + strings.ToLower(capName) + " " + real + ` "$@"` + "\n"
		if err := os.WriteFile(filepath.Join(dir, bin), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	return func() []string {
		data, err := os.ReadFile(log)
		if err != nil {
			return nil // none ran
		}
		return strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	}
}
