package vm

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kpproxy/kp/test/netns"
	"github.com/kpproxy/kp/test/vm/internal/boot"
)

// Kernel is an extracted kernel package.
type Kernel struct {
	// Release is the kernel's uname -r (6.1.0-56-cloud-amd64).
	Release string
	// Image is the bzImage qemu boots; ModulesDir its lib/modules/RELEASE.
	Image, ModulesDir string
	// Index describes its modules.
	Index boot.Index
}

// kernels caches FetchKernel's answer for this test process: the module
// index takes a few hundred milliseconds to read.
var kernels struct {
	once sync.Once
	k    *Kernel
	err  error
}

// FetchKernel returns the VM's kernel, fetching it on first use with
// test/vm/kernel.sh (cached across runs, see there).
func FetchKernel() (*Kernel, error) {
	kernels.once.Do(func() { kernels.k, kernels.err = fetchKernel() })
	return kernels.k, kernels.err
}

func fetchKernel() (*Kernel, error) {
	root, err := netns.ModuleRoot()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("bash", filepath.Join(root, "test", "vm", "kernel.sh"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("fetch the VM kernel (test/vm/kernel.sh): %w\n%s", err, stderr.String())
	}
	dir := strings.TrimSpace(string(out))
	images, _ := filepath.Glob(filepath.Join(dir, "boot", "vmlinuz-*"))
	if len(images) != 1 {
		return nil, fmt.Errorf("VM kernel in %s: want one boot/vmlinuz-*, found %d", dir, len(images))
	}
	k := &Kernel{Image: images[0], Release: strings.TrimPrefix(filepath.Base(images[0]), "vmlinuz-")}
	k.ModulesDir = filepath.Join(dir, "lib", "modules", k.Release)
	if k.Index, err = boot.ReadIndex(k.ModulesDir); err != nil {
		return nil, err
	}
	return k, nil
}

// Require skips t unless the VM can run here: root (virtiofsd shares the
// whole root), qemu-system-x86_64, virtiofsd and the kernel package. Under
// CI (CI set), where .ci/run installs them, a missing one fails t instead.
func Require(t testing.TB) *Kernel {
	t.Helper()
	skip := t.Skipf
	if os.Getenv("CI") != "" {
		skip = t.Fatalf
	}
	if os.Geteuid() != 0 {
		skip("skipped: the VM needs root (virtiofsd shares the host's root read-only)")
	}
	for _, bin := range []string{qemuBin, virtiofsdBin} {
		if _, err := exec.LookPath(bin); err != nil {
			skip("skipped: needs %s (apt-get install qemu-system-x86): %v", bin, err)
		}
	}
	k, err := FetchKernel()
	if err != nil {
		skip("skipped: no VM kernel: %v", err)
	}
	return k
}
