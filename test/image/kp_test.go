package image

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/kpproxy/kp/test/netns"
)

// testRef names kp's image in these tests.
const testRef = "kp.local/kp:image-test"

// kpBuild is what the tests share: per architecture, one static kp
// binary and kp's image; the host's image's tarball. Each is made at most
// once per test process in dir (removed by TestMain).
var kpBuild struct {
	dir string

	mu   sync.Mutex
	arch map[string]*archBuild

	tarOnce sync.Once
	tar     string
	tarErr  error
}

// archBuild is kp's binary and image for one architecture.
type archBuild struct {
	binOnce sync.Once
	bin     string
	binErr  error

	imgOnce sync.Once
	img     Image
	imgErr  error
}

func archBuildOf(arch string) *archBuild {
	kpBuild.mu.Lock()
	defer kpBuild.mu.Unlock()
	if kpBuild.arch == nil {
		kpBuild.arch = map[string]*archBuild{}
	}
	if kpBuild.arch[arch] == nil {
		kpBuild.arch[arch] = &archBuild{}
	}
	return kpBuild.arch[arch]
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kp-image-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	kpBuild.dir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// unavailable skips the test, or fails it under CI (CI set in the
// environment): CI installs everything, so a skip there would hide a broken
// setup.
func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// kpBinary is a static kp built from this repository for the host, as
// `make build` builds it.
func kpBinary(t testing.TB) string { return kpBinaryFor(t, runtime.GOARCH) }

// kpBinaryFor is kpBinary for the architecture arch (GOARCH).
func kpBinaryFor(t testing.TB, arch string) string {
	t.Helper()
	b := archBuildOf(arch)
	b.binOnce.Do(func() {
		root, err := netns.ModuleRoot()
		if err != nil {
			b.binErr = err
			return
		}
		b.bin = filepath.Join(kpBuild.dir, "kp-"+arch)
		cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-o", b.bin, "./cmd/kp")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.binErr = fmt.Errorf("GOARCH=%s go build ./cmd/kp: %w\n%s", arch, err, out)
		}
	})
	if b.binErr != nil {
		t.Fatal(b.binErr)
	}
	return b.bin
}

// kpImage is KP's image of kpBinary for the host. Without apt (or its
// lists, or the network) the test is skipped, or fails under CI.
func kpImage(t testing.TB) Image { return kpImageFor(t, runtime.GOARCH) }

// kpImageFor is kpImage for the architecture arch, from its Debian
// packages.
func kpImageFor(t testing.TB, arch string) Image {
	t.Helper()
	bin := kpBinaryFor(t, arch)
	b := archBuildOf(arch)
	b.imgOnce.Do(func() { b.img, b.imgErr = KP(bin, testRef, WithArch(arch)) })
	if errors.Is(b.imgErr, ErrDownload) {
		unavailable(t, "kp's image needs Debian packages: %v", b.imgErr)
	}
	if b.imgErr != nil {
		t.Fatal(b.imgErr)
	}
	return b.img
}

// kpTarball is kpImage written as a tarball.
func kpTarball(t testing.TB) string {
	t.Helper()
	img := kpImage(t)
	kpBuild.tarOnce.Do(func() {
		kpBuild.tar = filepath.Join(kpBuild.dir, "kp-image.tar")
		_, kpBuild.tarErr = Write(kpBuild.tar, img)
	})
	if kpBuild.tarErr != nil {
		t.Fatal(kpBuild.tarErr)
	}
	return kpBuild.tar
}

// imageFile is one entry of an image's flattened file system.
type imageFile struct {
	hdr  *tar.Header
	data []byte
}

// imageFS reads img's layers, flattened, into a map by absolute path.
func imageFS(t testing.TB, img Image) map[string]imageFile {
	t.Helper()
	built, err := Build(img)
	if err != nil {
		t.Fatal(err)
	}
	rc := mutate.Extract(built)
	defer rc.Close()
	files := map[string]imageFile{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[path.Clean("/"+h.Name)] = imageFile{hdr: h, data: data}
	}
}

// resolveIn follows symbolic links from p in files to a regular file.
func resolveIn(files map[string]imageFile, p string) (string, error) {
	for range 40 {
		f, ok := files[p]
		switch {
		case !ok:
			return "", fmt.Errorf("%s: no such file in the image", p)
		case f.hdr.Typeflag == tar.TypeSymlink:
			if path.IsAbs(f.hdr.Linkname) {
				p = path.Clean(f.hdr.Linkname)
			} else {
				p = path.Join(path.Dir(p), f.hdr.Linkname)
			}
		case f.hdr.Typeflag == tar.TypeReg:
			return p, nil
		default:
			return "", fmt.Errorf("%s: not a regular file", p)
		}
	}
	return "", fmt.Errorf("%s: too many levels of symbolic links", p)
}

func TestKPImageHoldsKPAndTheIptablesAndIpsetTools(t *testing.T) {
	files := imageFS(t, kpImage(t))
	for _, tc := range []struct {
		path string
		// link is the symbolic link's target, empty for an executable file.
		link string
	}{
		{path: "/usr/local/bin/kp"},
		{path: "/usr/local/bin/kp-top", link: "kp"},
		{path: "/usr/sbin/xtables-nft-multi"},
		{path: "/usr/sbin/xtables-legacy-multi"},
		{path: "/usr/sbin/ipset"},
		{path: "/usr/sbin/iptables-nft", link: "xtables-nft-multi"},
		{path: "/usr/sbin/iptables-nft-restore", link: "xtables-nft-multi"},
		{path: "/usr/sbin/iptables-nft-save", link: "xtables-nft-multi"},
		{path: "/usr/sbin/ip6tables-nft-restore", link: "xtables-nft-multi"},
		{path: "/usr/sbin/ip6tables-nft-save", link: "xtables-nft-multi"},
		{path: "/usr/sbin/iptables-legacy", link: "xtables-legacy-multi"},
		{path: "/usr/sbin/iptables-legacy-restore", link: "xtables-legacy-multi"},
		{path: "/usr/sbin/iptables-legacy-save", link: "xtables-legacy-multi"},
		{path: "/usr/sbin/ip6tables-legacy-restore", link: "xtables-legacy-multi"},
		{path: "/usr/sbin/ip6tables-legacy-save", link: "xtables-legacy-multi"},
		// Debian's alternatives, at the nft backend as on a Debian node.
		{path: "/usr/sbin/iptables", link: "iptables-nft"},
		{path: "/usr/sbin/iptables-restore", link: "iptables-nft-restore"},
		{path: "/usr/sbin/iptables-save", link: "iptables-nft-save"},
		{path: "/usr/sbin/ip6tables", link: "ip6tables-nft"},
		{path: "/usr/sbin/ip6tables-restore", link: "ip6tables-nft-restore"},
		{path: "/usr/sbin/ip6tables-save", link: "ip6tables-nft-save"},
		// Extensions are loaded with dlopen, so only the package list
		// brings them: the ones kp's iptables rules use.
		{path: "/usr/lib/x86_64-linux-gnu/xtables/libxt_comment.so"},
		{path: "/usr/lib/x86_64-linux-gnu/xtables/libxt_statistic.so"},
		{path: "/usr/lib/x86_64-linux-gnu/xtables/libxt_NAT.so"},
		{path: "/usr/lib/x86_64-linux-gnu/xtables/libxt_DNAT.so", link: "libxt_NAT.so"},
		{path: "/usr/lib/x86_64-linux-gnu/xtables/libxt_MASQUERADE.so", link: "libxt_NAT.so"},
		{path: "/usr/lib/x86_64-linux-gnu/xtables/libxt_set.so"},
		{path: "/lib64/ld-linux-x86-64.so.2", link: "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"},
		{path: "/etc/protocols"},
	} {
		f, ok := files[tc.path]
		switch {
		case !ok:
			t.Errorf("%s: not in the image", tc.path)
		case tc.link != "" && (f.hdr.Typeflag != tar.TypeSymlink || f.hdr.Linkname != tc.link):
			t.Errorf("%s: want a link to %s, have type %c link %q", tc.path, tc.link, f.hdr.Typeflag, f.hdr.Linkname)
		case tc.link == "" && f.hdr.Typeflag != tar.TypeReg:
			t.Errorf("%s: want a regular file, have type %c", tc.path, f.hdr.Typeflag)
		case tc.link == "" && strings.Contains(tc.path, "bin/") && f.hdr.Mode&0o111 == 0:
			t.Errorf("%s: not executable (mode %o)", tc.path, f.hdr.Mode)
		}
	}
	for _, dir := range []string{"/run", "/tmp"} {
		if f, ok := files[dir]; !ok || f.hdr.Typeflag != tar.TypeDir {
			t.Errorf("%s: want a directory (a mount point with readOnlyRootFilesystem)", dir)
		}
	}
}

func TestKPImageRunsKPProxyHelpByDefault(t *testing.T) {
	img := kpImage(t)
	if !slices.Equal(img.Entrypoint, []string{"/usr/local/bin/kp"}) || !slices.Equal(img.Cmd, []string{"proxy", "--help"}) {
		t.Errorf("entrypoint %q cmd %q, want [/usr/local/bin/kp] [proxy --help]", img.Entrypoint, img.Cmd)
	}
	if !slices.ContainsFunc(img.Env, func(e string) bool { return strings.HasPrefix(e, "PATH=") && strings.Contains(e, "/usr/sbin") }) {
		t.Errorf("env %q: no PATH with /usr/sbin, where kp finds iptables-restore and ipset", img.Env)
	}
}

func TestEveryELFFileInKPImageFindsItsLoaderAndLibraries(t *testing.T) {
	for _, arch := range []string{"amd64", "arm64"} {
		t.Run(arch, func(t *testing.T) {
			files := imageFS(t, kpImageFor(t, arch))
			dirs, err := libDirs(arch)
			if err != nil {
				t.Fatal(err)
			}
			elfs := 0
			for p, f := range files {
				if f.hdr.Typeflag != tar.TypeReg || !bytes.HasPrefix(f.data, []byte(elf.ELFMAG)) {
					continue
				}
				elfs++
				ef, err := elf.NewFile(bytes.NewReader(f.data))
				if err != nil {
					t.Errorf("%s: %v", p, err)
					continue
				}
				if ef.Machine != elfMachines[arch] {
					t.Errorf("%s: built for %v in the %s image", p, ef.Machine, arch)
				}
				for _, prog := range ef.Progs {
					if prog.Type != elf.PT_INTERP {
						continue
					}
					b, _ := io.ReadAll(prog.Open())
					if _, err := resolveIn(files, strings.TrimRight(string(b), "\x00")); err != nil {
						t.Errorf("%s: dynamic loader: %v", p, err)
					}
				}
				needed, err := ef.DynString(elf.DT_NEEDED)
				if err != nil {
					t.Errorf("%s: %v", p, err)
				}
				for _, lib := range needed {
					if !slices.ContainsFunc(dirs, func(dir string) bool {
						_, err := resolveIn(files, path.Join(dir, lib))
						return err == nil
					}) {
						t.Errorf("%s needs %s: not in the image's library directories", p, lib)
					}
				}
			}
			if elfs < 10 {
				t.Errorf("only %d ELF files in the image", elfs)
			}
		})
	}
}

func TestKPImageHasNoDanglingLinksDocsOrScripts(t *testing.T) {
	files := imageFS(t, kpImage(t))
	for p, f := range files {
		switch {
		case f.hdr.Typeflag == tar.TypeSymlink:
			if _, err := resolveIn(files, p); err != nil {
				t.Errorf("link %s -> %s dangles", p, f.hdr.Linkname)
			}
		case strings.HasPrefix(p, "/usr/share/man/"),
			strings.HasPrefix(p, "/usr/share/doc/") && path.Base(p) != "copyright" && f.hdr.Typeflag == tar.TypeReg:
			t.Errorf("%s: documentation in the image", p)
		case f.hdr.Typeflag == tar.TypeReg && bytes.HasPrefix(f.data, []byte("#!")):
			t.Errorf("%s: a script, with no interpreter in the image", p)
		}
	}
}

func TestALibraryMissingFromThePackagesIsAnErrorNamingWhoNeedsIt(t *testing.T) {
	kpImage(t) // fills the package cache, or skips without apt
	cache, err := debCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	tree, err := fetchDebs(cache, "", KPPackages())
	if err != nil {
		t.Fatal(err)
	}
	for p, f := range tree.files {
		if f.pkg == "libmnl0" {
			delete(tree.files, p)
		}
	}
	nft := "/usr/sbin/xtables-nft-multi"
	_, err = libraryClosure(tree, map[string]string{nft: tree.files[nft].host})
	if err == nil || !strings.Contains(err.Error(), "libmnl.so.0") {
		t.Errorf("closure without libmnl0: error %v, want one naming libmnl.so.0", err)
	}
}
