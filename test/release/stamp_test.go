package release

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/test/netns"
)

// make build and the Dockerfile stamp kp as make release does: the
// version, the commit and the commit's date (not the build's).
func TestMakeBuildAndTheDockerfileStampTheCommitDate(t *testing.T) {
	root, err := netns.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("make"); err != nil {
		netns.Unavailable(t, "skipped: no make on the PATH")
	}
	ct, err := exec.Command("git", "-C", root, "log", "-1", "--format=%ct").Output()
	if err != nil {
		t.Fatal(err)
	}
	sec, err := strconv.ParseInt(strings.TrimSpace(string(ct)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	date := time.Unix(sec, 0).UTC().Format(time.RFC3339)
	cmd := exec.Command("make", "-s", "-n", "build")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n build: %v\n%s", err, out)
	}
	for _, want := range []string{"-X main.date=" + date, "-X main.commit=", "-X main.version=", "-trimpath", "CGO_ENABLED=0"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("make build runs %q, without %q", out, want)
		}
	}
	dockerfile, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ARG DATE", "-X main.date=${DATE}"} {
		if !strings.Contains(string(dockerfile), want) {
			t.Errorf("the Dockerfile has no %q", want)
		}
	}
}
