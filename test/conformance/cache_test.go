package conformance

import (
	"testing"

	"github.com/kpproxy/kp/test/images"
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

// cached finds the artifacts test/images knows (make conformance-bins
// test-images), agnhost mended (see fixAgnhost).
func cached(t *testing.T) artifacts {
	t.Helper()
	a := artifacts{
		e2eTest:  images.ConformanceBin(t, images.E2ETest),
		ginkgo:   images.ConformanceBin(t, images.Ginkgo),
		corefile: images.Corefile(t),
	}
	for _, img := range images.All(t) {
		tarball := img.Tarball
		switch img.Name {
		case images.CoreDNS:
			a.coredns = img.Ref
		case images.Agnhost:
			var err error
			if tarball, err = fixAgnhost(t.TempDir(), tarball, img.Ref); err != nil {
				t.Fatalf("agnhost: %v", err)
			}
		}
		a.tarballs = append(a.tarballs, tarball)
	}
	return a
}
