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

// builds caches the binaries built for this test process, one per package.
var builds struct {
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
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if builds.dir != "" {
		os.RemoveAll(builds.dir)
	}
	return code
}

// Build compiles one main package of the kp module, named by its path from
// the module root (for example "./cmd/kp" or "./test/echo"), once per test
// process, and returns the binary's path.
func Build(pkg string) (string, error) {
	return once(pkg, func() (string, error) { return goBuild("", pkg, false) })
}

// BuildNested is Build for a main package of one of the repository's
// nested modules, whose dependencies stay out of kp's go.mod: module is
// its folder from the repository's root ("test/helm"), pkg the package's
// path in it ("./cmd/kp-chart").
func BuildNested(module, pkg string) (string, error) {
	return once("nested:"+module+":"+pkg, func() (string, error) { return goBuild(module, pkg, false) })
}

// BuildStatic is Build for binaries that go into container images: built
// with CGO_ENABLED=0, so they need no C library, and named NAME-static.
func BuildStatic(pkg string) (string, error) {
	return once("static:"+pkg, func() (string, error) { return goBuild("", pkg, true) })
}

// once runs build the first time key is asked for, and returns its
// answer every time.
func once(key string, build func() (string, error)) (string, error) {
	builds.mu.Lock()
	if builds.bins == nil {
		builds.bins = map[string]*built{}
	}
	b := builds.bins[key]
	if b == nil {
		b = &built{}
		builds.bins[key] = b
	}
	builds.mu.Unlock()

	b.once.Do(func() { b.path, b.err = build() })
	return b.path, b.err
}

// BinDirEnv names a folder of binaries built beforehand (NAME for
// "./.../NAME", NAME-static for BuildStatic): Build returns those instead
// of building. The VM sets it: compiling under software emulation takes
// minutes, so the host builds and the guest runs.
const BinDirEnv = "KP_TEST_BINDIR"

// goBuild builds pkg of the kp module, or of the nested module in folder
// module of the repository when set.
func goBuild(module, pkg string, static bool) (string, error) {
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
	builds.mu.Lock()
	if builds.dir == "" {
		// The pid in the name lets SweepStale remove it if this run is killed.
		builds.dir, err = os.MkdirTemp("", fmt.Sprintf("%s%d-", binDirPrefix, os.Getpid()))
	}
	dir := builds.dir
	builds.mu.Unlock()
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
	cmd.Dir = filepath.Join(root, module)
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
