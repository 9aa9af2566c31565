package conformance

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// artifacts are what the conformance run needs besides the cluster's own
// binaries: upstream's e2e.test and ginkgo, the images its tests run
// (agnhost, busybox, pause), CoreDNS and its Corefile.
type artifacts struct {
	e2eTest, ginkgo string
	tarballs        []string // Docker tarballs, imported into every node
	coredns         string   // CoreDNS's image reference
	corefile        string
}

// cached finds the artifacts in the kube cache, where test/k8s's
// conformance-bins.sh and images.sh (branch i12-images) put them. A
// stand-in until test/images lands: swap this one function for it.
func cached(t *testing.T) artifacts {
	t.Helper()
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(cache, "kp-test")
	if v := os.Getenv("KP_KUBE_CACHE"); v != "" {
		root = v
	}
	a := artifacts{
		e2eTest: filepath.Join(root, "conformance-kube-v1.36.3-ginkgo-v2.28.1", "e2e.test"),
		ginkgo:  filepath.Join(root, "conformance-kube-v1.36.3-ginkgo-v2.28.1", "ginkgo"),
	}
	dirs, _ := filepath.Glob(filepath.Join(root, "images-kube-v1.36.3-coredns-v1.15.0-*"))
	if len(dirs) != 1 {
		t.Fatalf("want one images folder under %s, found %v (make test-images)", root, dirs)
	}
	a.corefile = filepath.Join(dirs[0], "Corefile")
	f, err := os.Open(filepath.Join(dirs[0], "images.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		// name reference tarball
		fields := strings.Fields(s.Text())
		if len(fields) != 3 {
			continue
		}
		a.tarballs = append(a.tarballs, filepath.Join(dirs[0], fields[2]))
		if fields[0] == "coredns" {
			a.coredns = fields[1]
		}
	}
	for _, p := range append([]string{a.e2eTest, a.ginkgo, a.corefile}, a.tarballs...) {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("conformance artifacts: %v (make conformance-bins test-images)", err)
		}
	}
	return a
}
