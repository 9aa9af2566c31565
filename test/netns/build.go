package netns

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// binDirPrefix starts the name of the temporary folder binaries are built
// into: kp-test-bin-PID-RANDOM.
const binDirPrefix = "kp-test-bin-"

// build caches the binaries built for this test process, one per package.
var build struct {
	mu   sync.Mutex
	dir  string
	bins map[string]*built
}

type built struct {
	once sync.Once
	path string
	err  error
}

// Main runs a package's tests and then removes the binaries Build made for
// them. Call it from TestMain: os.Exit(netns.Main(m)).
func Main(m *testing.M) int {
	code := m.Run()
	build.mu.Lock()
	defer build.mu.Unlock()
	if build.dir != "" {
		os.RemoveAll(build.dir)
	}
	return code
}

// Build compiles one main package of the kp module, named by its path from
// the module root (for example "./cmd/kp" or "./test/echo"), once per test
// process, and returns the binary's path.
func Build(pkg string) (string, error) {
	build.mu.Lock()
	if build.bins == nil {
		build.bins = map[string]*built{}
	}
	b := build.bins[pkg]
	if b == nil {
		b = &built{}
		build.bins[pkg] = b
	}
	build.mu.Unlock()

	b.once.Do(func() { b.path, b.err = goBuild(pkg, false) })
	return b.path, b.err
}

// BuildStatic is Build for binaries that go into container images: built
// with CGO_ENABLED=0, so they need no C library, and named NAME-static.
func BuildStatic(pkg string) (string, error) {
	build.mu.Lock()
	if build.bins == nil {
		build.bins = map[string]*built{}
	}
	b := build.bins["static:"+pkg]
	if b == nil {
		b = &built{}
		build.bins["static:"+pkg] = b
	}
	build.mu.Unlock()

	b.once.Do(func() { b.path, b.err = goBuild(pkg, true) })
	return b.path, b.err
}

// BinDirEnv names a folder of binaries built beforehand (NAME for
// "./.../NAME", NAME-static for BuildStatic): Build returns those instead
// of building. The VM sets it: compiling under software emulation takes
// minutes, so the host builds and the guest runs.
const BinDirEnv = "KP_TEST_BINDIR"

func goBuild(pkg string, static bool) (string, error) {
	if dir := os.Getenv(BinDirEnv); dir != "" {
		p := filepath.Join(dir, filepath.Base(pkg))
		if static {
			p += "-static"
		}
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	build.mu.Lock()
	if build.dir == "" {
		// The pid in the name lets SweepStale remove it if this run is killed.
		build.dir, err = os.MkdirTemp("", fmt.Sprintf("%s%d-", binDirPrefix, os.Getpid()))
	}
	dir := build.dir
	build.mu.Unlock()
	if err != nil {
		return "", fmt.Errorf("build %s: %w", pkg, err)
	}
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", out, pkg)
	if static {
		out += "-static"
		cmd = exec.Command("go", "build", "-trimpath", "-o", out, pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	}
	cmd.Dir = root
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, msg)
	}
	return out, nil
}

// ModuleRoot is the directory holding the kp module's go.mod.
func ModuleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if errors.Is(err, exec.ErrNotFound) {
		// A test binary run without a Go toolchain (in the VM, where
		// KP_TEST_BINDIR holds the binaries): go test's working folder is
		// the package's, so the nearest go.mod above it, as go env finds.
		return goModAbove()
	}
	if err != nil {
		return "", fmt.Errorf("find module root: go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("find module root: not inside a Go module")
	}
	return filepath.Dir(gomod), nil
}

func goModAbove() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find module root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("find module root: no go on the PATH and no go.mod above the working folder")
		}
		dir = parent
	}
}
