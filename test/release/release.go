// Package release builds kp's release into one directory, as `make release
// VERSION=vX.Y.Z` does (cmd/kp-release):
//
//	kp-linux-amd64, kp-linux-arm64      static kp binaries (CGO_ENABLED=0,
//	                                    -trimpath), stamped with the version,
//	                                    the commit and the commit's date
//	kp-image.oci.tar                    kp's image for both architectures: an
//	                                    OCI image index in an OCI layout
//	                                    tarball (test/image, no daemon)
//	<each of the above>.cdx.json        its SBOM (CycloneDX 1.6 JSON)
//	kp-manifests.yaml                   manifests/ rendered, the image pinned
//	                                    to the index's digest
//	kp-<version without v>.tgz          the Helm chart charts/kp, packaged,
//	                                    the image pinned to the same digest
//	SHA256SUMS                          every other file's SHA-256
//
// A release is reproducible: the same commit, Go toolchain and Debian
// packages (kept in the image cache) give the same files, byte for byte.
// No time stamp is the build's: files carry the Unix epoch, SBOMs the
// commit's date, serial numbers derive from the artifact's hash.
//
// It lives under test/ with the image tooling, so that the product's
// packages import none of it (nor CycloneDX).
package release

import (
	"context"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kpproxy/kp/test/image"
)

// DefaultImageRepo is where the release's image is published.
const DefaultImageRepo = "ghcr.io/kpproxy/kp"

// Arches are the architectures a release is built for.
var Arches = []string{"amd64", "arm64"}

// Options says what to release.
type Options struct {
	// Root is the repository's checkout.
	Root string
	// Out is the directory to write; it is replaced if it holds an
	// earlier release (a SHA256SUMS) or nothing, and refused otherwise.
	Out string
	// Version is the release's, vMAJOR.MINOR.PATCH with an optional
	// pre-release (v0.1.0, v0.2.0-rc.1).
	Version string
	// ImageRepo is the image's repository, DefaultImageRepo if empty.
	ImageRepo string
	// Commit and Date default to HEAD's hash and its commit date.
	Commit, Date string
	// AllowDirty releases a checkout with changes git has not committed
	// (tests); the binaries then hold what the commit does not.
	AllowDirty bool
	// Cache holds the Debian packages (image.WithCache); empty is the
	// image package's default.
	Cache string
	// Log, if set, is told each step.
	Log io.Writer
}

// Release is what Build wrote.
type Release struct {
	Options
	// Image is the image pinned by digest, repo@sha256:...
	Image string
	Index image.WrittenIndex
	// Files are the names written in Out, SHA256SUMS last.
	Files []string
}

var semver = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$`)

// binary is one kp binary of the release.
type binary struct {
	arch, name, path, sha256 string
}

// platformImage is one architecture's image with the binary in it.
type platformImage struct {
	arch string
	img  image.Image
	bin  binary
	info *debug.BuildInfo
}

// Build writes the release described by o.
func Build(ctx context.Context, o Options) (*Release, error) {
	r := &Release{Options: o}
	if r.ImageRepo == "" {
		r.ImageRepo = DefaultImageRepo
	}
	if !semver.MatchString(r.Version) {
		return nil, fmt.Errorf("release: version %q: want vMAJOR.MINOR.PATCH, e.g. v0.1.0 (make release VERSION=v0.1.0)", r.Version)
	}
	if err := r.gitFacts(ctx); err != nil {
		return nil, err
	}
	if err := prepareOut(r.Out); err != nil {
		return nil, err
	}
	r.logf("release %s of commit %s (%s) into %s", r.Version, r.Commit, r.Date, r.Out)

	var imgs []platformImage
	for _, arch := range Arches {
		b, info, err := r.buildBinary(ctx, arch)
		if err != nil {
			return nil, err
		}
		sbom, err := binarySBOM(r, b, info)
		if err != nil {
			return nil, err
		}
		if err := r.write(b.name+".cdx.json", sbom); err != nil {
			return nil, err
		}
		opts := []image.KPOption{image.WithArch(arch)}
		if r.Cache != "" {
			opts = append(opts, image.WithCache(r.Cache))
		}
		r.logf("image for linux/%s", arch)
		img, err := image.KP(b.path, r.ImageRepo+":"+r.Version, opts...)
		if err != nil {
			return nil, fmt.Errorf("release: %w", err)
		}
		img.Labels = r.annotations()
		imgs = append(imgs, platformImage{arch: arch, img: img, bin: b, info: info})
	}

	const imageFile = "kp-image.oci.tar"
	idx := image.Index{Ref: r.ImageRepo + ":" + r.Version, Annotations: r.annotations()}
	for _, pi := range imgs {
		idx.Images = append(idx.Images, pi.img)
	}
	r.logf("image index %s", imageFile)
	var err error
	if r.Index, err = image.WriteIndex(filepath.Join(r.Out, imageFile), idx); err != nil {
		return nil, fmt.Errorf("release: %w", err)
	}
	r.Files = append(r.Files, imageFile)
	r.Image = r.ImageRepo + "@" + r.Index.Digest.String()
	sum, err := fileSHA256(filepath.Join(r.Out, imageFile))
	if err != nil {
		return nil, err
	}
	sbom, err := imageSBOM(r, r.Index, imgs, sum)
	if err != nil {
		return nil, err
	}
	if err := r.write(imageFile+".cdx.json", sbom); err != nil {
		return nil, err
	}

	r.logf("manifests pinned to %s", r.Image)
	manifests, err := renderKustomization(filepath.Join(r.Root, "manifests"),
		kustomizeImage{Name: "kp", NewName: r.ImageRepo, Digest: r.Index.Digest.String()})
	if err != nil {
		return nil, fmt.Errorf("release: %w", err)
	}
	header := fmt.Sprintf("# kp %s (commit %s): manifests/ rendered, the image pinned by digest.\n#   kubectl apply -f kp-manifests.yaml\n# Set the cluster's pod CIDRs (clusterCIDR) and API server in the kp ConfigMap first: see manifests/.\n", r.Version, r.Commit)
	if err := r.write("kp-manifests.yaml", append([]byte(header), manifests...)); err != nil {
		return nil, err
	}

	if err := r.chart(ctx); err != nil {
		return nil, err
	}
	if err := r.writeSums(); err != nil {
		return nil, err
	}
	return r, nil
}

// chartEpoch is every file's time in the chart's archive, as in the image's.
const chartEpoch = "1970-01-01T00:00:00Z"

// chart packages the Helm chart, charts/kp, as helm package does, into
// kp-<version>.tgz (the release's version without its v: a chart's version
// is SemVer): its appVersion the release's, its image pinned to the index's
// digest in its values.yaml, every file's time the epoch. Helm's Go module
// lives in test/helm, a module of its own, so its kp-chart does it (go run:
// Go caches the executable). A tree without the chart releases none.
func (r *Release) chart(ctx context.Context) error {
	dir := filepath.Join(r.Root, "charts", "kp")
	if _, err := os.Stat(filepath.Join(dir, "Chart.yaml")); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	version := strings.TrimPrefix(r.Version, "v")
	r.logf("chart kp-%s.tgz", version)
	cmd := exec.CommandContext(ctx, "go", "run", "-buildvcs=false", "./cmd/kp-chart", "package", dir, "-d", r.Out,
		"--version", version, "--app-version", r.Version, "--image-repository", r.ImageRepo,
		"--image-digest", r.Index.Digest.String(), "--mod-time", chartEpoch)
	cmd.Dir = filepath.Join(r.Root, "test", "helm")
	// kp-chart runs here, whatever the binaries' GOARCH.
	cmd.Env = append(os.Environ(), "GOOS=", "GOARCH=", "GOFLAGS=-mod=readonly")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("release: package the chart (test/helm: go run ./cmd/kp-chart package): %w\n%s", err, stderr.String())
	}
	name := "kp-" + version + ".tgz"
	if got := strings.TrimSpace(string(out)); got != filepath.Join(r.Out, name) {
		return fmt.Errorf("release: kp-chart package wrote %q, want %s", got, filepath.Join(r.Out, name))
	}
	r.Files = append(r.Files, name)
	return nil
}

// annotations are the OCI annotations of the index and the labels of each
// image.
func (r *Release) annotations() map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":    "kp",
		"org.opencontainers.image.version":  r.Version,
		"org.opencontainers.image.revision": r.Commit,
		"org.opencontainers.image.created":  r.Date,
		"org.opencontainers.image.source":   "https://github.com/kpproxy/kp",
	}
}

// gitFacts fills in the commit and its date, and refuses a dirty checkout
// unless allowed.
func (r *Release) gitFacts(ctx context.Context) error {
	git := func(args ...string) (string, error) {
		out, err := exec.CommandContext(ctx, "git", append([]string{"-C", r.Root}, args...)...).Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return "", fmt.Errorf("release: git %s: %v\n%s", strings.Join(args, " "), err, ee.Stderr)
			}
			return "", fmt.Errorf("release: git %s: %w", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out)), nil
	}
	if r.Commit == "" {
		c, err := git("rev-parse", "HEAD")
		if err != nil {
			return err
		}
		r.Commit = c
	}
	if r.Date == "" {
		ct, err := git("log", "-1", "--format=%ct", r.Commit)
		if err != nil {
			return err
		}
		sec, err := strconv.ParseInt(ct, 10, 64)
		if err != nil {
			return fmt.Errorf("release: commit date %q: %w", ct, err)
		}
		r.Date = time.Unix(sec, 0).UTC().Format(time.RFC3339)
	}
	if !r.AllowDirty {
		st, err := git("status", "--porcelain")
		if err != nil {
			return err
		}
		if st != "" {
			return fmt.Errorf("release: the checkout has changes not committed (git status):\n%s\ncommit them first: a release is built from its commit", st)
		}
	}
	return nil
}

// prepareOut empties out, if it holds an earlier release or nothing.
func prepareOut(out string) error {
	entries, err := os.ReadDir(out)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return fmt.Errorf("release: %w", err)
	case len(entries) > 0:
		if _, err := os.Stat(filepath.Join(out, "SHA256SUMS")); err != nil {
			return fmt.Errorf("release: %s is not empty and holds no earlier release (no SHA256SUMS): remove it or choose another", out)
		}
		if err := os.RemoveAll(out); err != nil {
			return fmt.Errorf("release: %w", err)
		}
	}
	return os.MkdirAll(out, 0o755)
}

// buildBinary builds kp for linux/arch, as make build does but for every
// setting that changes the file pinned (no C, no paths of this machine,
// the architectures' baseline instruction sets, modules as go.sum says).
func (r *Release) buildBinary(ctx context.Context, arch string) (binary, *debug.BuildInfo, error) {
	b := binary{arch: arch, name: "kp-linux-" + arch}
	b.path = filepath.Join(r.Out, b.name)
	r.logf("go build %s", b.name)
	ldflags := fmt.Sprintf("-s -w -X main.version=%s -X main.commit=%s -X main.date=%s", r.Version, r.Commit, r.Date)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", b.path, "./cmd/kp")
	cmd.Dir = r.Root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch,
		"GOAMD64=v1", "GOARM64=v8.0", "GOFLAGS=-mod=readonly", "GOEXPERIMENT=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return b, nil, fmt.Errorf("release: GOARCH=%s go build ./cmd/kp: %w\n%s", arch, err, out)
	}
	info, err := buildinfo.ReadFile(b.path)
	if err != nil {
		return b, nil, fmt.Errorf("release: %s: build information: %w", b.name, err)
	}
	if b.sha256, err = fileSHA256(b.path); err != nil {
		return b, nil, err
	}
	r.Files = append(r.Files, b.name)
	return b, info, nil
}

func (r *Release) write(name string, data []byte) error {
	if err := os.WriteFile(filepath.Join(r.Out, name), data, 0o644); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	r.Files = append(r.Files, name)
	return nil
}

// writeSums writes SHA256SUMS as sha256sum prints it (sha256sum -c
// SHA256SUMS checks it), in name order.
func (r *Release) writeSums() error {
	names := slices.Clone(r.Files)
	slices.Sort(names)
	var b strings.Builder
	for _, n := range names {
		sum, err := fileSHA256(filepath.Join(r.Out, n))
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s  %s\n", sum, n)
	}
	return r.write("SHA256SUMS", []byte(b.String()))
}

func (r *Release) logf(format string, args ...any) {
	if r.Log != nil {
		fmt.Fprintf(r.Log, "release: "+format+"\n", args...)
	}
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("release: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("release: %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
