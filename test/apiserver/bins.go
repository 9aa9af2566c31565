package apiserver

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Binaries the cache directory holds (see test/k8s/build.sh).
const (
	KubeAPIServer = "kube-apiserver"
	Kubectl       = "kubectl"
	KubeProxy     = "kube-proxy"
	Etcd          = "etcd"
	// The rest of a control plane and a node, for the real-node tests
	// (test/cluster).
	KubeControllerManager = "kube-controller-manager"
	KubeScheduler         = "kube-scheduler"
	Kubelet               = "kubelet"
)

// BinDir is where test/k8s/build.sh puts the binaries: $KP_KUBE_CACHE, else
// the user's cache directory plus kp-test, then kube-VERSION-etcd-VERSION with
// the versions test/k8s pins. Deriving the name from the pins means a version
// bump builds and uses new binaries, never stale ones.
func BinDir() (string, error) {
	k8sDir, err := K8sModuleDir()
	if err != nil {
		return "", err
	}
	kube, err := RequiredVersion(filepath.Join(k8sDir, "go.mod"), "k8s.io/kubernetes")
	if err != nil {
		return "", err
	}
	etcd, err := RequiredVersion(filepath.Join(k8sDir, "etcd", "go.mod"), "go.etcd.io/etcd/server/v3")
	if err != nil {
		return "", err
	}
	root, err := CacheRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, fmt.Sprintf("kube-%s-etcd-%s", kube, etcd)), nil
}

// CacheRoot is where make kube-bins, test-images and conformance-bins keep
// what they build: $KP_KUBE_CACHE, else the user's cache directory plus
// kp-test.
func CacheRoot() (string, error) {
	if root := os.Getenv("KP_KUBE_CACHE"); root != "" {
		return root, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("kube binaries: cache root: %w", err)
	}
	return filepath.Join(cache, "kp-test"), nil
}

// Bin returns the path of one cached binary (KubeAPIServer, Kubectl,
// KubeProxy, Etcd). It skips t when the binaries are not built, or fails it
// under CI, where make builds them before the tests.
func Bin(t testing.TB, name string) string {
	t.Helper()
	dir, err := BinDir()
	if err != nil {
		t.Fatalf("kube binaries: %v", err)
	}
	path := filepath.Join(dir, name)
	if _, err := os.Stat(path); err != nil {
		skip := t.Skipf
		if os.Getenv("CI") != "" {
			skip = t.Fatalf
		}
		skip("skipped: %s is not built (run make kube-bins, about 10 minutes the first time): %v", name, err)
	}
	return path
}

// K8sModuleDir finds test/k8s (the nested module the test binaries and
// images are built from) from this source file, or from the module root
// when the file's path is not usable (a -trimpath build).
func K8sModuleDir() (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok {
		dir := filepath.Join(filepath.Dir(file), "..", "k8s")
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("find test/k8s: go env GOMOD: %w", err)
	}
	return filepath.Join(filepath.Dir(strings.TrimSpace(string(out))), "test", "k8s"), nil
}

// RequiredVersion reads module's version from a go.mod's require lines.
func RequiredVersion(gomod, module string) (string, error) {
	f, err := os.Open(gomod)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(strings.TrimPrefix(strings.TrimSpace(sc.Text()), "require "))
		if len(fields) >= 2 && fields[0] == module {
			return fields[1], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%s: no require line for %s", gomod, module)
}
