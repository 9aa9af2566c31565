package image

import (
	"archive/tar"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func TestWrittenTarballHoldsEachImageWithItsFilesAndConfig(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "tool")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "images.tar")
	imgs := []Image{{
		Ref:        "kp.local/tool:v1",
		Layers:     [][]Entry{{File("/usr/local/bin/tool", bin), Symlink("/usr/local/bin/tool-link", "tool")}},
		Entrypoint: []string{"/usr/local/bin/tool"},
		Env:        []string{"PATH=/usr/local/bin"},
	}, {
		Ref:    "kp.local/data:v1",
		Layers: [][]Entry{{{Path: "/etc/data", Data: []byte("hello")}}, {Dir("/tmp")}},
	}}
	written, err := Write(dst, imgs...)
	if err != nil {
		t.Fatal(err)
	}
	if len(written) != 2 {
		t.Fatalf("written = %v", written)
	}

	tag, err := name.NewTag("kp.local/tool:v1")
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(dst, &tag)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := img.Digest(); d != written[0].Digest {
		t.Errorf("digest in tarball %v, reported %v", d, written[0].Digest)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.Config.Entrypoint, []string{"/usr/local/bin/tool"}) || cfg.OS != "linux" || cfg.Architecture != "amd64" {
		t.Errorf("config = %+v", cfg.Config)
	}
	files := map[string]*tar.Header{}
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = h
	}
	if h := files["usr/local/bin/tool"]; h == nil || h.FileInfo().Mode().Perm() != 0o755 || h.Size != 10 {
		t.Errorf("tool entry = %+v", h)
	}
	if h := files["usr/local/bin/tool-link"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "tool" {
		t.Errorf("link entry = %+v", h)
	}
	if h := files["usr/local"]; h == nil || h.FileInfo().Mode()&fs.ModeDir == 0 {
		t.Errorf("parent directory usr/local not written: %v", files)
	}
}

func TestSameInputsGiveTheSameDigest(t *testing.T) {
	img := Image{Ref: "kp.local/app:v1", Layers: [][]Entry{{{Path: "/a", Data: []byte("x")}, {Path: "/b/c", Data: []byte("y")}}}}
	a, err := Write(filepath.Join(t.TempDir(), "1.tar"), img)
	if err != nil {
		t.Fatal(err)
	}
	// Entry order does not matter either.
	img.Layers[0][0], img.Layers[0][1] = img.Layers[0][1], img.Layers[0][0]
	b, err := Write(filepath.Join(t.TempDir(), "2.tar"), img)
	if err != nil {
		t.Fatal(err)
	}
	if a[0].Digest != b[0].Digest {
		t.Errorf("digests differ: %v, %v", a[0].Digest, b[0].Digest)
	}
}

func TestAPathListedTwiceIsAnError(t *testing.T) {
	img := Image{Ref: "kp.local/app:v1", Layers: [][]Entry{{{Path: "/a", Data: []byte("x")}, {Path: "/a/", Data: []byte("y")}}}}
	if _, err := Write(filepath.Join(t.TempDir(), "x.tar"), img); err == nil {
		t.Error("no error for a path listed twice")
	}
}
