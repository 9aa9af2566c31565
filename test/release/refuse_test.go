package release

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// gitRepo is a repository with one commit of one file, for the checks a
// release makes before it builds anything.
func gitRepo(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, args := range [][]string{
		{"init", "-q"},
		{"-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "--allow-empty", "-m", "first"},
	} {
		if out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	return dir
}

func TestReleaseRefusesBeforeBuildingAnything(t *testing.T) {
	clean := gitRepo(t)
	dirty := gitRepo(t)
	if err := os.WriteFile(filepath.Join(dirty, "new.go"), []byte("package x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	foreign := t.TempDir()
	if err := os.WriteFile(filepath.Join(foreign, "notes.txt"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"a version that is not vX.Y.Z", Options{Root: clean, Version: "1.0"}, `version "1.0": want vMAJOR.MINOR.PATCH`},
		{"git describe's version", Options{Root: clean, Version: "787e14b-dirty"}, "want vMAJOR.MINOR.PATCH"},
		{"a checkout with changes", Options{Root: dirty, Version: "v0.1.0"}, "new.go"},
		{"an output directory holding something else", Options{Root: clean, Version: "v0.1.0", Out: foreign}, "holds no earlier release"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.o.Out == "" {
				tc.o.Out = filepath.Join(t.TempDir(), "dist")
			}
			_, err := Build(context.Background(), tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Build: %v, want an error containing %q", err, tc.want)
			}
			if tc.o.Out != foreign {
				if _, err := os.Stat(tc.o.Out); !os.IsNotExist(err) {
					t.Errorf("refused, yet %s was made (%v)", tc.o.Out, err)
				}
			}
		})
	}
	if _, err := os.Stat(filepath.Join(foreign, "notes.txt")); err != nil {
		t.Errorf("a refused release touched the directory: %v", err)
	}
}

// A tree without the Helm chart releases none (a release of an older
// commit); with it, TestReleasePackagesTheChartPinnedToItsImage.
func TestReleaseOfATreeWithoutAChartHasNone(t *testing.T) {
	r := &Release{Options: Options{Root: t.TempDir()}}
	if err := r.chart(context.Background()); err != nil || len(r.Files) != 0 {
		t.Errorf("no charts/: %v, files %q, want no error and no file", err, r.Files)
	}
}
