package conformance

import (
	"testing"

	"github.com/kpproxy/kp/test/images"
)

// artifacts are what the conformance run needs besides the cluster's own
// binaries: upstream's e2e.test and ginkgo, and the images its tests run
// (agnhost, busybox, pause, glibc-dns-testing, distroless-iptables,
// regression-issue-74839). CoreDNS comes with
// cluster.DeployDNS.
type artifacts struct {
	e2eTest, ginkgo string
	tarballs        []string // Docker tarballs, imported into every node
}

// cached finds the artifacts test/images knows (make conformance-bins
// test-images).
func cached(t *testing.T) artifacts {
	t.Helper()
	a := artifacts{
		e2eTest: images.ConformanceBin(t, images.E2ETest),
		ginkgo:  images.ConformanceBin(t, images.Ginkgo),
	}
	for _, img := range images.All(t) {
		if img.Name != images.CoreDNS {
			a.tarballs = append(a.tarballs, img.Tarball)
		}
	}
	return a
}
