package image

import (
	"archive/tar"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
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
func TestKPImageToolsRunFromTheImageAlone(t *testing.T) {
	if os.Geteuid() != 0 {
		unavailable(t, "skipped: chroot and a new network namespace need root")
	}
	img := kpImage(t)
	dir := t.TempDir()
	unpack(t, img, dir)
	for _, tc := range []struct {
		name string
		argv []string
		want string
	}{
		{"kp reports its version", []string{"/usr/local/bin/kp", "version"}, "kp version"},
		{"kp-top is kp top", []string{"/usr/local/bin/kp-top", "--help"}, "kp top is"},
		{"iptables is the nft backend", []string{"/usr/sbin/iptables", "--version"}, "(nf_tables)"},
		{"iptables-nft runs", []string{"/usr/sbin/iptables-nft", "--version"}, "(nf_tables)"},
		{"iptables-nft-restore runs", []string{"/usr/sbin/iptables-nft-restore", "--version"}, "(nf_tables)"},
		{"iptables-restore is the nft backend", []string{"/usr/sbin/iptables-restore", "--version"}, "(nf_tables)"},
		{"ip6tables-nft-save runs", []string{"/usr/sbin/ip6tables-nft-save", "--version"}, "(nf_tables)"},
		{"iptables-legacy runs", []string{"/usr/sbin/iptables-legacy", "--version"}, "(legacy)"},
		{"iptables-legacy-restore runs", []string{"/usr/sbin/iptables-legacy-restore", "--version"}, "(legacy)"},
		{"ip6tables-legacy-save runs", []string{"/usr/sbin/ip6tables-legacy-save", "--version"}, "(legacy)"},
		{"ipset runs", []string{"/usr/sbin/ipset", "--version"}, "ipset v"},
		{"iptables-nft loads the statistic and comment extensions", []string{"/usr/sbin/iptables-nft", "-m", "statistic", "-m", "comment", "--help"}, "statistic match options"},
		{"iptables-legacy loads the DNAT and set extensions", []string{"/usr/sbin/iptables-legacy", "-j", "DNAT", "-m", "set", "--help"}, "DNAT target options"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Absolute paths: exec looks names up in the host's PATH.
			cmd := exec.Command(tc.argv[0], tc.argv[1:]...)
			cmd.Env, cmd.Dir = img.Env, "/"
			cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: dir, Cloneflags: syscall.CLONE_NEWNET}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("chroot %s %q: %v\n%s", dir, tc.argv, err, out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Errorf("%q printed %q, want it to contain %q", tc.argv, out, tc.want)
			}
		})
	}
}
