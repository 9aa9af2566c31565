// Package images finds what test/k8s/images.sh and
// test/k8s/conformance-bins.sh build for the real-node tests: the container
// images (CoreDNS, agnhost, busybox, pause, glibc-dns-testing,
// distroless-iptables, regression-issue-74839) as Docker-format tarballs
// with the references they carry, CoreDNS's Corefile, and upstream's e2e.test and
// ginkgo. Like test/apiserver's Bin, each helper skips the test when they
// are not built, or fails it under CI, where make builds them first.
package images

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kpproxy/kp/test/apiserver"
)

// The images images.sh builds.
const (
	// CoreDNS is a CoreDNS with only the plugins a cluster DNS uses, as
	// kp.local/coredns:VERSION; its entrypoint serves the Corefile baked in
	// at /etc/coredns/Corefile (a ConfigMap mounted on /etc/coredns
	// replaces it).
	CoreDNS = "coredns"
	// Agnhost, BusyBox and Pause carry the exact references the e2e
	// framework of the pinned Kubernetes asks for (test/utils/image), e.g.
	// registry.k8s.io/e2e-test-images/agnhost:2.63.0.
	Agnhost = "agnhost"
	BusyBox = "busybox"
	Pause   = "pause"
	// GlibcDNSTesting is what upstream's DNS tests run their glibc
	// querier in: Debian 12's dig, nslookup, getent and dash.
	GlibcDNSTesting = "glibc-dns-testing"
	// DistrolessIptables is what upstream's KubeProxy CLOSE_WAIT test
	// reads the node's conntrack table with, on the host network:
	// Debian 12's iptables, nft, ipset, conntrack, dash, which, grep.
	DistrolessIptables = "distroless-iptables"
	// RegressionIssue74839 is upstream's boom server of the Conntrack
	// invalid-state test, built from the pinned k8s.io/kubernetes.
	RegressionIssue74839 = "regression-issue-74839"
)

// The binaries conformance-bins.sh builds.
const (
	E2ETest = "e2e.test"
	Ginkgo  = "ginkgo"
)

const conformanceTarget = "make conformance-bins"

// Image is one built image.
type Image struct {
	// Name is one of the constants above.
	Name string
	// Ref is the reference the tarball holds the image under; after
	// `ctr -n k8s.io images import`, pods name it as their image (with
	// imagePullPolicy: Never, as no registry is reachable).
	Ref string
	// Tarball is the Docker-format tarball's path.
	Tarball string
}

// Get returns one image, by one of the names above. It skips t when the
// images are not built (fails it under CI).
func Get(t testing.TB, name string) Image {
	t.Helper()
	for _, img := range All(t) {
		if img.Name == name {
			return img
		}
	}
	t.Fatalf("images: no image %q (want %s, %s, %s, %s, %s, %s or %s)", name, CoreDNS, Agnhost, BusyBox, Pause,
		GlibcDNSTesting, DistrolessIptables, RegressionIssue74839)
	return Image{}
}

// All returns every image images.sh builds, in its order.
func All(t testing.TB) []Image {
	t.Helper()
	dir := built(t, Dir, "images.txt", "make test-images")
	imgs, err := readList(dir)
	if err != nil {
		t.Fatal(err)
	}
	return imgs
}

// Corefile returns the path of the Corefile the CoreDNS image carries: the
// cluster domain cluster.local and the reverse zones from the kubernetes
// plugin, and nothing else (no forward: queries for other names are
// refused, so nothing leaves the machine).
func Corefile(t testing.TB) string {
	t.Helper()
	return filepath.Join(built(t, Dir, "Corefile", "make test-images"), "Corefile")
}

// Bin returns the path of one of the static binaries in the images
// (coredns, agnhost, busybox, pause, regression-issue-74839), to run on
// the host.
func Bin(t testing.TB, name string) string {
	t.Helper()
	dir := built(t, Dir, filepath.Join("bin", name), "make test-images")
	return filepath.Join(dir, "bin", name)
}

// ConformanceBin returns the path of E2ETest or Ginkgo. It skips t when
// they are not built, under CI too: make test does not build them.
func ConformanceBin(t testing.TB, name string) string {
	t.Helper()
	return filepath.Join(built(t, ConformanceDir, name, conformanceTarget), name)
}

// KubeVersion is the k8s.io/kubernetes version test/k8s pins, which
// e2e.test and agnhost are built from.
func KubeVersion() (string, error) {
	repo, err := repoRoot()
	if err != nil {
		return "", err
	}
	return apiserver.RequiredVersion(filepath.Join(repo, "test/k8s/go.mod"), "k8s.io/kubernetes")
}

// Import loads imgs into the containerd at address (its gRPC socket), in
// the k8s.io namespace the CRI plugin, and so kubelet, reads images from,
// with the ctr at ctrPath. Pods then name them by Ref with
// imagePullPolicy: Never (or IfNotPresent and a tag other than latest).
func Import(ctx context.Context, ctrPath, address string, imgs ...Image) error {
	for _, img := range imgs {
		out, err := exec.CommandContext(ctx, ctrPath, "--address", address, "--namespace", "k8s.io",
			"images", "import", img.Tarball).CombinedOutput()
		if err != nil {
			return fmt.Errorf("import %s into containerd at %s: %w: %s", img.Ref, address, err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// Dir is where images.sh puts the images:
// images-kube-VERSION-coredns-VERSION-HASH under the cache root, the
// versions those test/k8s and test/k8s/coredns pin and HASH a digest of
// every file the images are made from, so that a change to any of them
// builds new images instead of using stale ones.
func Dir() (string, error) {
	repo, err := repoRoot()
	if err != nil {
		return "", err
	}
	kube, err := apiserver.RequiredVersion(filepath.Join(repo, "test/k8s/go.mod"), "k8s.io/kubernetes")
	if err != nil {
		return "", err
	}
	coredns, err := apiserver.RequiredVersion(filepath.Join(repo, "test/k8s/coredns/go.mod"), "github.com/coredns/coredns")
	if err != nil {
		return "", err
	}
	sum, err := sourcesHash(repo)
	if err != nil {
		return "", err
	}
	root, err := apiserver.CacheRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, fmt.Sprintf("images-kube-%s-coredns-%s-%s", kube, coredns, sum)), nil
}

// ConformanceDir is where conformance-bins.sh puts e2e.test and ginkgo:
// conformance-kube-VERSION-ginkgo-VERSION under the cache root.
func ConformanceDir() (string, error) {
	repo, err := repoRoot()
	if err != nil {
		return "", err
	}
	gomod := filepath.Join(repo, "test/k8s/go.mod")
	kube, err := apiserver.RequiredVersion(gomod, "k8s.io/kubernetes")
	if err != nil {
		return "", err
	}
	ginkgo, err := apiserver.RequiredVersion(gomod, "github.com/onsi/ginkgo/v2")
	if err != nil {
		return "", err
	}
	root, err := apiserver.CacheRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, fmt.Sprintf("conformance-kube-%s-ginkgo-%s", kube, ginkgo)), nil
}

// imageSources are the files and directories, from the repository root,
// images.sh hashes (test files excluded). Keep both lists the same.
var imageSources = []string{"test/k8s/images.sh", "test/k8s/common.sh", "test/k8s/coredns", "test/k8s/images", "test/image"}

// sourcesHash is images.sh's
//
//	find SOURCES -type f ! -name '*_test.go' | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-12
//
// run from the repository root.
func sourcesHash(repo string) (string, error) {
	var files []string
	for _, src := range imageSources {
		err := filepath.WalkDir(filepath.Join(repo, src), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.Type().IsRegular() && !strings.HasSuffix(d.Name(), "_test.go") {
				rel, err := filepath.Rel(repo, p)
				if err != nil {
					return err
				}
				files = append(files, filepath.ToSlash(rel))
			}
			return nil
		})
		if err != nil {
			return "", fmt.Errorf("images: hash sources: %w", err)
		}
	}
	slices.Sort(files)
	sums := sha256.New()
	for _, f := range files {
		h := sha256.New()
		in, err := os.Open(filepath.Join(repo, f))
		if err != nil {
			return "", fmt.Errorf("images: hash sources: %w", err)
		}
		_, err = io.Copy(h, in)
		in.Close()
		if err != nil {
			return "", fmt.Errorf("images: hash sources: %s: %w", f, err)
		}
		fmt.Fprintf(sums, "%x  %s\n", h.Sum(nil), f)
	}
	return fmt.Sprintf("%x", sums.Sum(nil))[:12], nil
}

// built returns the directory dirFn names once it holds want, and skips t
// until then; under CI, where make test builds the images first, it fails t
// instead, except for the conformance binaries make test does not build.
func built(t testing.TB, dirFn func() (string, error), want, target string) string {
	t.Helper()
	dir, err := dirFn()
	if err != nil {
		t.Fatalf("images: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, want)); err != nil {
		skip := t.Skipf
		if os.Getenv("CI") != "" && target != conformanceTarget {
			skip = t.Fatalf
		}
		skip("skipped: %s is not built (run %s): %v", want, target, err)
	}
	return dir
}

// readList reads images.sh's images.txt: one "name ref file" line per image.
func readList(dir string) ([]Image, error) {
	data, err := os.ReadFile(filepath.Join(dir, "images.txt"))
	if err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	var imgs []Image
	for i, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			return nil, fmt.Errorf("images: %s/images.txt line %d: want name, ref and file, got %q", dir, i+1, line)
		}
		imgs = append(imgs, Image{Name: f[0], Ref: f[1], Tarball: filepath.Join(dir, f[2])})
	}
	return imgs, nil
}

// repoRoot is the repository: test/k8s's grandparent.
func repoRoot() (string, error) {
	k8s, err := apiserver.K8sModuleDir()
	if err != nil {
		return "", err
	}
	return filepath.Dir(filepath.Dir(k8s)), nil
}
