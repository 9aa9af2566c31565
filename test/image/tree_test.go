package image

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func TestTreeListsDirectoriesFilesAndLinksWithTheirModes(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"bin", "etc/coredns"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), []byte("elf"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/coredns/Corefile"), []byte(".:53 {}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/bin/busybox", filepath.Join(root, "bin/sh")); err != nil {
		t.Fatal(err)
	}
	entries, err := Tree(root)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Entry{}
	for _, e := range entries {
		got[e.Path] = e
	}
	if len(got) != 6 {
		t.Errorf("entries = %+v, want bin, bin/busybox, bin/sh, etc, etc/coredns, etc/coredns/Corefile", entries)
	}
	if e := got["/bin/busybox"]; e.Mode != 0o755 || e.Source != filepath.Join(root, "bin/busybox") {
		t.Errorf("/bin/busybox = %+v", e)
	}
	if e := got["/etc/coredns/Corefile"]; e.Mode != 0o600 {
		t.Errorf("/etc/coredns/Corefile = %+v", e)
	}
	if e := got["/bin/sh"]; e.Mode&fs.ModeSymlink == 0 || e.Link != "/bin/busybox" {
		t.Errorf("/bin/sh = %+v", e)
	}
	if e := got["/etc/coredns"]; !e.Mode.IsDir() {
		t.Errorf("/etc/coredns = %+v", e)
	}
	if _, err := layerTar(entries); err != nil {
		t.Errorf("layer of the tree: %v", err)
	}
}
