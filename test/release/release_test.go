package release

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"debug/buildinfo"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	cdx "github.com/CycloneDX/cyclonedx-go"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kpproxy/kp/proxy/statusapi"
	"github.com/kpproxy/kp/test/image"
	"github.com/kpproxy/kp/test/netns"
)

const testVersion = "v0.0.0-test.1"

// shared is one release the tests read, built at most once per test
// process into dir (removed by TestMain).
var shared struct {
	dir  string
	once sync.Once
	rel  *Release
	took time.Duration
	err  error
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kp-release-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	shared.dir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// buildRelease builds a release of this checkout (changes not committed
// included) into out.
func buildRelease(t testing.TB, out string) (*Release, error) {
	t.Helper()
	root, err := netns.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return Build(context.Background(), Options{Root: root, Out: out, Version: testVersion, AllowDirty: true})
}

// sharedRelease is the tests' release. Without apt (or its lists, or the
// network) for the image's Debian packages the test is skipped, or fails
// under CI.
func sharedRelease(t testing.TB) *Release {
	t.Helper()
	shared.once.Do(func() {
		start := time.Now()
		shared.rel, shared.err = buildRelease(t, filepath.Join(shared.dir, "dist"))
		shared.took = time.Since(start)
	})
	if errors.Is(shared.err, image.ErrDownload) {
		netns.Unavailable(t, "the release's image needs Debian packages: %v", shared.err)
	}
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.rel
}

// Two releases of one checkout are the same files, byte for byte: the
// binaries, the image index (so its digest, which the manifests pin), the
// SBOMs and the manifests. The second build reuses Go's build cache and
// the Debian packages, not the first's files.
func TestReleaseTwiceGivesTheSameFiles(t *testing.T) {
	first := sharedRelease(t)
	start := time.Now()
	second, err := buildRelease(t, filepath.Join(t.TempDir(), "dist"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first release %v, second %v", shared.took.Round(time.Second), time.Since(start).Round(time.Second))
	a, err := os.ReadFile(filepath.Join(first.Out, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(second.Out, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Errorf("two releases differ:\nfirst SHA256SUMS:\n%s\nsecond:\n%s", a, b)
	}
	if first.Image != second.Image {
		t.Errorf("pinned images differ: %s, %s", first.Image, second.Image)
	}
}

func TestReleaseHoldsBinariesImageSBOMsManifestsAndSums(t *testing.T) {
	r := sharedRelease(t)
	want := []string{"SHA256SUMS", "kp-" + strings.TrimPrefix(testVersion, "v") + ".tgz", "kp-image.oci.tar", "kp-image.oci.tar.cdx.json", "kp-linux-amd64", "kp-linux-amd64.cdx.json",
		"kp-linux-arm64", "kp-linux-arm64.cdx.json", "kp-manifests.yaml"}
	entries, err := os.ReadDir(r.Out)
	if err != nil {
		t.Fatal(err)
	}
	var have []string
	for _, e := range entries {
		have = append(have, e.Name())
	}
	if !slices.Equal(have, want) {
		t.Errorf("release files %q, want %q", have, want)
	}

	// SHA256SUMS lists every other file with its hash, as sha256sum -c
	// reads it.
	sums, err := os.ReadFile(filepath.Join(r.Out, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, line := range strings.Split(strings.TrimSuffix(string(sums), "\n"), "\n") {
		sum, name, ok := strings.Cut(line, "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q: want <sha256>  <name>", line)
		}
		if got := sha256Of(t, filepath.Join(r.Out, name)); got != sum {
			t.Errorf("SHA256SUMS: %s has %s, the file %s", name, sum, got)
		}
		listed = append(listed, name)
	}
	if !slices.Equal(listed, want[1:]) {
		t.Errorf("SHA256SUMS lists %q, want %q", listed, want[1:])
	}
	cmd := exec.Command("sha256sum", "-c", "--strict", "SHA256SUMS")
	cmd.Dir = r.Out
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("sha256sum -c SHA256SUMS: %v\n%s", err, out)
	}

	// Static binaries of each architecture, built as make build builds
	// them, stamped with the release.
	for arch, machine := range map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64} {
		path := filepath.Join(r.Out, "kp-linux-"+arch)
		f, err := elf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		if f.Machine != machine {
			t.Errorf("%s: built for %v", path, f.Machine)
		}
		if slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP }) {
			t.Errorf("%s: dynamically linked (has a program interpreter)", path)
		}
		f.Close()
		info, err := buildinfo.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		settings := map[string]string{}
		for _, s := range info.Settings {
			settings[s.Key] = s.Value
		}
		// -trimpath leaves -ldflags out of the build information: the
		// version stamped is TestReleaseBinariesReportTheirRelease's.
		want := map[string]string{"CGO_ENABLED": "0", "-trimpath": "true", "GOARCH": arch, "GOOS": "linux"}
		if arch == "amd64" {
			want["GOAMD64"] = "v1"
		} else {
			want["GOARM64"] = "v8.0"
		}
		for k, v := range want {
			if settings[k] != v {
				t.Errorf("%s: build setting %s=%q, want %q", path, k, settings[k], v)
			}
		}
	}
	if _, err := time.Parse(time.RFC3339, r.Date); err != nil || !strings.HasSuffix(r.Date, "Z") {
		t.Errorf("date %q: want RFC 3339 in UTC (%v)", r.Date, err)
	}

	// The index in the tarball is the one the manifests pin, for both
	// platforms.
	index := ociIndex(t, filepath.Join(r.Out, "kp-image.oci.tar"))
	if index.digest != r.Index.Digest {
		t.Errorf("the tarball's index.json names %s, the release pinned %s", index.digest, r.Index.Digest)
	}
	if index.name != DefaultImageRepo+":"+testVersion {
		t.Errorf("the tarball names the image %q, want %s:%s", index.name, DefaultImageRepo, testVersion)
	}
	var platforms []string
	for _, m := range index.manifest.Manifests {
		platforms = append(platforms, m.Platform.String())
		if m.Digest != r.Index.Manifests[m.Platform.Architecture] {
			t.Errorf("%s: manifest %s, the release reported %s", m.Platform, m.Digest, r.Index.Manifests[m.Platform.Architecture])
		}
	}
	if !slices.Equal(platforms, []string{"linux/amd64", "linux/arm64"}) {
		t.Errorf("index platforms %q, want linux/amd64, linux/arm64", platforms)
	}
	if got := index.manifest.Annotations["org.opencontainers.image.revision"]; got != r.Commit {
		t.Errorf("index revision annotation %q, want %s", got, r.Commit)
	}

	manifests, err := os.ReadFile(filepath.Join(r.Out, "kp-manifests.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	images := imagesIn(t, manifests)
	if len(images) != 2 || images[0] != r.Image || images[1] != r.Image {
		t.Errorf("kp-manifests.yaml runs images %q, want the init container and kp on %s", images, r.Image)
	}
	if r.Image != DefaultImageRepo+"@"+r.Index.Digest.String() {
		t.Errorf("pinned image %s, want %s@%s", r.Image, DefaultImageRepo, r.Index.Digest)
	}
}

// The release's Helm chart is charts/kp packaged as helm package does:
// the release's version (without its v) and appVersion in Chart.yaml, the
// image pinned to the release's index in values.yaml, every file's time
// the epoch. (test/helm's TestPackagedChartCarriesTheRelease renders such
// an archive: the DaemonSet runs repository@digest.)
func TestReleasePackagesTheChartPinnedToItsImage(t *testing.T) {
	r := sharedRelease(t)
	version := strings.TrimPrefix(testVersion, "v")
	f, err := os.Open(filepath.Join(r.Out, "kp-"+version+".tgz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(time.Unix(0, 0)) {
			t.Errorf("%s: time %v, want the epoch", h.Name, h.ModTime)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = string(data)
	}
	for name, want := range map[string][]string{
		"kp/Chart.yaml":  {"\nname: kp\n", "\nversion: " + version + "\n", "\nappVersion: " + testVersion + "\n"},
		"kp/values.yaml": {"\n  repository: \"" + DefaultImageRepo + "\"\n", "\n  digest: \"" + r.Index.Digest.String() + "\"\n"},
	} {
		text, ok := files[name]
		if !ok {
			t.Errorf("the chart's archive has no %s; it has %d files", name, len(files))
			continue
		}
		for _, w := range want {
			if !strings.Contains("\n"+text, w) {
				t.Errorf("%s lacks %q:\n%s", name, strings.TrimSpace(w), text)
			}
		}
	}
	if _, ok := files["kp/templates/daemonset.yaml"]; !ok {
		t.Errorf("the chart's archive has no kp/templates/daemonset.yaml")
	}
}

// The release's binaries report the release's version, commit and date:
// the host's directly, arm64's under qemu-user.
func TestReleaseBinariesReportTheirRelease(t *testing.T) {
	r := sharedRelease(t)
	want := statusapi.Build{Version: testVersion, Commit: r.Commit, BuildDate: r.Date}
	for _, arch := range Arches {
		t.Run(arch, func(t *testing.T) {
			argv := []string{filepath.Join(r.Out, "kp-linux-"+arch), "version", "-o", "json"}
			if arch != runtime.GOARCH {
				argv = append([]string{qemuUser(t, arch)}, argv...)
			}
			out, err := exec.Command(argv[0], argv[1:]...).Output()
			if err != nil {
				t.Fatalf("%q: %v", argv, err)
			}
			var got statusapi.Build
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("%q printed %q: %v", argv, out, err)
			}
			if got.Version != want.Version || got.Commit != want.Commit || got.BuildDate != want.BuildDate ||
				got.Platform != "linux/"+arch || !strings.HasPrefix(got.GoVersion, "go") {
				t.Errorf("%q: %+v, want %+v on linux/%s", argv, got, want, arch)
			}
		})
	}
}

// qemuUser is qemu's user-mode emulator of arch, or the test is skipped
// (failed under CI, which installs qemu-user-static).
func qemuUser(t *testing.T, arch string) string {
	t.Helper()
	name := map[string]string{"arm64": "qemu-aarch64-static", "amd64": "qemu-x86_64-static"}[arch]
	p, err := exec.LookPath(name)
	if err != nil {
		netns.Unavailable(t, "skipped: running the %s binary needs %s (apt-get install qemu-user-static)", arch, name)
	}
	return p
}

func TestReleaseSBOMsListWhatIsInEachArtifact(t *testing.T) {
	r := sharedRelease(t)
	for _, arch := range Arches {
		t.Run("kp-linux-"+arch, func(t *testing.T) {
			bin := filepath.Join(r.Out, "kp-linux-"+arch)
			bom := readBOM(t, bin+".cdx.json")
			root := bom.Metadata.Component
			if root == nil || root.Name != "kp" || root.Version != testVersion || hashOf(root) != sha256Of(t, bin) {
				t.Fatalf("metadata.component %+v: want kp %s with the binary's SHA-256 %s", root, testVersion, sha256Of(t, bin))
			}
			if bom.Metadata.Timestamp != r.Date {
				t.Errorf("timestamp %s, want the commit's date %s", bom.Metadata.Timestamp, r.Date)
			}
			info, err := buildinfo.ReadFile(bin)
			if err != nil {
				t.Fatal(err)
			}
			listed := map[string]string{}
			for _, c := range *bom.Components {
				listed[c.Name] = c.Version
			}
			if listed["std"] != info.GoVersion {
				t.Errorf("std %q, want the toolchain %s", listed["std"], info.GoVersion)
			}
			for _, m := range info.Deps {
				v := m.Version
				if m.Replace != nil {
					v = m.Replace.Version
				}
				if listed[m.Path] != v {
					t.Errorf("module %s: listed at %q, linked at %s", m.Path, listed[m.Path], v)
				}
			}
			if len(listed) != len(info.Deps)+1 {
				t.Errorf("%d components, want %d modules and std", len(listed), len(info.Deps))
			}
		})
	}
	t.Run("kp-image.oci.tar", func(t *testing.T) {
		bom := readBOM(t, filepath.Join(r.Out, "kp-image.oci.tar.cdx.json"))
		if root := bom.Metadata.Component; root == nil || hashOf(root) != r.Index.Digest.Hex {
			t.Fatalf("metadata.component %+v: want the index, digest %s", root, r.Index.Digest)
		}
		if len(*bom.Components) != len(Arches) {
			t.Fatalf("%d platform images, want %d", len(*bom.Components), len(Arches))
		}
		for _, img := range *bom.Components {
			arch := strings.TrimPrefix(img.BOMRef, "linux/")
			if hashOf(&img) != r.Index.Manifests[arch].Hex {
				t.Errorf("%s: hash %s, want the manifest's %s", img.BOMRef, hashOf(&img), r.Index.Manifests[arch])
			}
			var pkgs []string
			var kp *cdx.Component
			for _, c := range *img.Components {
				if c.Name == "kp" {
					kp = &c
					continue
				}
				pkgs = append(pkgs, c.Name)
				if !strings.HasPrefix(c.PackageURL, "pkg:deb/debian/"+c.Name+"@") ||
					!strings.Contains(c.PackageURL, "arch="+arch) && !strings.Contains(c.PackageURL, "arch=all") {
					t.Errorf("%s: package %s has purl %s", img.BOMRef, c.Name, c.PackageURL)
				}
			}
			if want := image.KPPackages(); !slices.Equal(pkgs, want) {
				t.Errorf("%s: packages %q, want %q", img.BOMRef, pkgs, want)
			}
			if kp == nil || hashOf(kp) != sha256Of(t, filepath.Join(r.Out, "kp-linux-"+arch)) {
				t.Errorf("%s: kp %+v, want the hash of kp-linux-%s", img.BOMRef, kp, arch)
			}
		}
	})
}

func readBOM(t *testing.T, path string) *cdx.BOM {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var bom cdx.BOM
	if err := cdx.NewBOMDecoder(f, cdx.BOMFileFormatJSON).Decode(&bom); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if bom.SpecVersion != sbomSpec || !strings.HasPrefix(bom.SerialNumber, "urn:uuid:") || bom.Metadata == nil || bom.Components == nil {
		t.Fatalf("%s: spec %v, serial %q, metadata %v: not a complete CycloneDX 1.6 BOM", path, bom.SpecVersion, bom.SerialNumber, bom.Metadata)
	}
	return &bom
}

func hashOf(c *cdx.Component) string {
	if c.Hashes == nil {
		return ""
	}
	for _, h := range *c.Hashes {
		if h.Algorithm == cdx.HashAlgoSHA256 {
			return h.Value
		}
	}
	return ""
}

func sha256Of(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// ociLayout is what a layout tarball's index.json names and the image
// index it points to.
type ociLayout struct {
	name     string
	digest   v1.Hash
	manifest v1.IndexManifest
}

func ociIndex(t *testing.T, tarball string) ociLayout {
	t.Helper()
	f, err := os.Open(tarball)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg && (h.Name == "index.json" || h.Size < 1<<20) {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[h.Name] = b
		}
	}
	var top v1.IndexManifest
	if err := json.Unmarshal(files["index.json"], &top); err != nil || len(top.Manifests) != 1 {
		t.Fatalf("index.json %s: %v", files["index.json"], err)
	}
	l := ociLayout{name: top.Manifests[0].Annotations["io.containerd.image.name"], digest: top.Manifests[0].Digest}
	if err := json.Unmarshal(files["blobs/sha256/"+l.digest.Hex], &l.manifest); err != nil {
		t.Fatalf("image index %s: %v", l.digest, err)
	}
	return l
}
