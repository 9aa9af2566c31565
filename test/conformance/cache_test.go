package conformance

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
	// The folder's name ends in a digest of the sources: the newest
	// complete one.
	lists, _ := filepath.Glob(filepath.Join(root, "images-kube-v1.36.3-coredns-v1.15.0-*", "images.txt"))
	var dir string
	var newest time.Time
	for _, l := range lists {
		if st, err := os.Stat(l); err == nil && st.ModTime().After(newest) {
			dir, newest = filepath.Dir(l), st.ModTime()
		}
	}
	if dir == "" {
		t.Fatalf("no images under %s (make test-images)", root)
	}
	a.corefile = filepath.Join(dir, "Corefile")
	f, err := os.Open(filepath.Join(dir, "images.txt"))
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
		tarball := filepath.Join(dir, fields[2])
		switch fields[0] {
		case "coredns":
			a.coredns = fields[1]
		case "agnhost":
			if tarball, err = fixAgnhost(t.TempDir(), tarball, fields[1]); err != nil {
				t.Fatalf("agnhost: %v", err)
			}
		}
		a.tarballs = append(a.tarballs, tarball)
	}
	for _, p := range append([]string{a.e2eTest, a.ginkgo, a.corefile}, a.tarballs...) {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("conformance artifacts: %v (make conformance-bins test-images)", err)
		}
	}
	return a
}
