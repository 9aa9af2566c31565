package image

import (
	"archive/tar"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// unpack writes img's layers, flattened, into dir. os.Root keeps every path
// inside dir, whatever links the image holds.
func unpack(t *testing.T, img Image, dir string) {
	t.Helper()
	built, err := Build(img)
	if err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	rc := mutate.Extract(built)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		name := path.Clean(h.Name)
		if d := path.Dir(name); d != "." {
			if err := root.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		mode := fs.FileMode(h.Mode).Perm()
		switch h.Typeflag {
		case tar.TypeDir:
			err = root.MkdirAll(name, mode)
			if err == nil {
				err = root.Chmod(name, mode|fs.FileMode(h.FileInfo().Mode()&fs.ModeSticky))
			}
		case tar.TypeSymlink:
			err = root.Symlink(h.Linkname, name)
		case tar.TypeReg:
			var f *os.File
			if f, err = root.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode); err == nil {
				_, err = io.Copy(f, tr)
				if cerr := f.Close(); err == nil {
					err = cerr
				}
			}
		default:
			t.Fatalf("%s: unexpected tar type %c", name, h.Typeflag)
		}
		if err != nil {
			t.Fatalf("unpack %s: %v", name, err)
		}
	}
}

// The image's tools run from its own files alone: each command runs chrooted
// into the unpacked image, in a network namespace of its own (so nothing
// could reach the host's firewall; and nothing here asks to). Extension
// help (-m ... --help) loads the extension with dlopen without a kernel.
// The arm64 image's run under qemu-user (qemu-aarch64-static, copied into
// the unpacked image, runs the command as an arm64 process would: its
// loader, libraries and extensions are the image's arm64 files).
func TestKPImageToolsRunFromTheImageAlone(t *testing.T) {
	if os.Geteuid() != 0 {
		unavailable(t, "skipped: chroot and a new network namespace need root")
	}
	for _, arch := range []string{"amd64", "arm64"} {
		t.Run(arch, func(t *testing.T) {
			var emulator string
			if arch != runtime.GOARCH {
				emulator = qemuUser(t, arch)
			}
			img := kpImageFor(t, arch)
			dir := t.TempDir()
			unpack(t, img, dir)
			var prefix []string
			if emulator != "" {
				// Static, so it runs in the image with nothing of the host's.
				if err := copyFile(emulator, filepath.Join(dir, "qemu-user"), 0o755); err != nil {
					t.Fatal(err)
				}
				prefix = []string{"/qemu-user"}
			}
			runImageTools(t, img, dir, prefix)
		})
	}
}

// qemuUser is the path of qemu's user-mode emulator of arch
// (qemu-aarch64-static, from Debian's qemu-user-static), or the test is
// skipped (failed under CI, which installs it).
func qemuUser(t *testing.T, arch string) string {
	t.Helper()
	name := map[string]string{"arm64": "qemu-aarch64-static", "amd64": "qemu-x86_64-static"}[arch]
	p, err := exec.LookPath(name)
	if err != nil {
		unavailable(t, "skipped: the %s image's tools need %s (apt-get install qemu-user-static)", arch, name)
	}
	return p
}

func copyFile(src, dst string, mode os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, mode)
}

// runImageTools runs kp and the iptables and ipset tools in the image
// unpacked in dir, each command after prefix (an emulator, or none).
//
// qemu-user (7.2, Debian 12's) translates only some netlink protocols and
// refuses a NETLINK_NETFILTER socket with EPROTONOSUPPORT, which
// iptables-nft and ipset open before they print their version. Under an
// emulator those commands must fail with exactly that refusal, in their
// own words: the tool started, with the image's loader and every library
// it links, and reached its main.
func runImageTools(t *testing.T, img Image, dir string, prefix []string) {
	const (
		nftRefused   = "iptables: Failed to initialize nft: Protocol not supported"
		ipsetRefused = "ipset v7.17: Cannot open session to kernel."
	)
	for _, tc := range []struct {
		name string
		argv []string
		want string
		// emulated is what the command prints under qemu-user when that
		// differs from want, as a failure.
		emulated string
	}{
		{"kp reports its version", []string{"/usr/local/bin/kp", "version"}, "kp version", ""},
		{"kp-top is kp top", []string{"/usr/local/bin/kp-top", "--help"}, "kp top is", ""},
		{"iptables is the nft backend", []string{"/usr/sbin/iptables", "--version"}, "(nf_tables)", nftRefused},
		{"iptables-nft runs", []string{"/usr/sbin/iptables-nft", "--version"}, "(nf_tables)", nftRefused},
		{"iptables-nft-restore runs", []string{"/usr/sbin/iptables-nft-restore", "--version"}, "(nf_tables)", ""},
		{"iptables-restore is the nft backend", []string{"/usr/sbin/iptables-restore", "--version"}, "(nf_tables)", ""},
		{"ip6tables-nft-save runs", []string{"/usr/sbin/ip6tables-nft-save", "--version"}, "(nf_tables)", ""},
		{"iptables-legacy runs", []string{"/usr/sbin/iptables-legacy", "--version"}, "(legacy)", ""},
		{"iptables-legacy-restore runs", []string{"/usr/sbin/iptables-legacy-restore", "--version"}, "(legacy)", ""},
		{"ip6tables-legacy-save runs", []string{"/usr/sbin/ip6tables-legacy-save", "--version"}, "(legacy)", ""},
		{"ipset runs", []string{"/usr/sbin/ipset", "--version"}, "ipset v", ipsetRefused},
		{"iptables-nft loads the statistic and comment extensions", []string{"/usr/sbin/iptables-nft", "-m", "statistic", "-m", "comment", "--help"}, "statistic match options", nftRefused},
		{"iptables-legacy loads the DNAT and set extensions", []string{"/usr/sbin/iptables-legacy", "-j", "DNAT", "-m", "set", "--help"}, "DNAT target options", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			argv := append(slices.Clone(prefix), tc.argv...)
			// Absolute paths: exec looks names up in the host's PATH.
			cmd := exec.Command(argv[0], argv[1:]...)
			cmd.Env, cmd.Dir = img.Env, "/"
			cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: dir, Cloneflags: syscall.CLONE_NEWNET}
			out, err := cmd.CombinedOutput()
			if len(prefix) > 0 && tc.emulated != "" {
				if err == nil || !strings.Contains(string(out), tc.emulated) {
					t.Errorf("under qemu-user %q: %v, printed %q; want qemu's netlink refusal %q", argv, err, out, tc.emulated)
				}
				return
			}
			if err != nil {
				t.Fatalf("chroot %s %q: %v\n%s", dir, argv, err, out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Errorf("%q printed %q, want it to contain %q", argv, out, tc.want)
			}
		})
	}
}
