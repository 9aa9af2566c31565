// Package image writes container images without a daemon or a registry: a
// list of files becomes one layer, a list of images one Docker-format
// tarball that `docker load`, `ctr images import` and `kind load
// image-archive` accept. kp's own image (make image) and the images the
// real-node tests run (pause, echo servers, cluster DNS) are built with it.
//
// Images are reproducible: every file gets the same time stamp and owner,
// entries are written in path order, so the same inputs give the same digest.
package image

import (
	"archive/tar"
	"bytes"
	"cmp"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// epoch is every file's modification time: a fixed one keeps digests stable.
var epoch = time.Unix(0, 0).UTC()

// Entry is one file, directory or symbolic link of a layer.
type Entry struct {
	// Path is the absolute path in the image, e.g. /usr/local/bin/kp.
	Path string
	// Mode holds the permission bits (and fs.ModeSetuid, fs.ModeSetgid,
	// fs.ModeSticky), plus fs.ModeDir for a directory or fs.ModeSymlink for
	// a link. Zero means 0644 for a file (0755 when
	// Source is executable), 0755 for a directory.
	Mode fs.FileMode
	// Source is a host file whose content the entry takes; Data is the
	// content inline. At most one of them is set for a regular file.
	Source string
	Data   []byte
	// Link is a symbolic link's target (Mode has fs.ModeSymlink).
	Link string
}

// Dir is a directory entry.
func Dir(p string) Entry { return Entry{Path: p, Mode: fs.ModeDir | 0o755} }

// Symlink is a symbolic link entry at p pointing to target.
func Symlink(p, target string) Entry {
	return Entry{Path: p, Mode: fs.ModeSymlink | 0o777, Link: target}
}

// File is a regular file entry with the content of a host file.
func File(p, source string) Entry { return Entry{Path: p, Source: source} }

// Image is one image to write: its reference, its layers (each a list of
// entries; parent directories are added as needed) and its configuration.
type Image struct {
	// Ref names the image in the tarball, e.g. kp.local/kp:dev. Use a
	// dotted registry name: containerd normalises bare names to docker.io.
	Ref        string
	Layers     [][]Entry
	Entrypoint []string
	Cmd        []string
	Env        []string
	WorkingDir string
	User       string
	Labels     map[string]string
	// Arch is the image's architecture, amd64 (the default) or arm64: its
	// configuration says it, and its files must be built for it.
	Arch string
	// OCI writes OCI media types (manifest, configuration, layers) in
	// place of Docker's: the release's OCI image index holds such images.
	OCI bool
	// Packages are the Debian packages the image's files come from, for a
	// bill of materials; nothing of them is written but their files.
	Packages []DebPackage
}

// Written reports one image of a tarball.
type Written struct {
	Ref string
	// Digest is the manifest digest (what a registry would serve); ID the
	// config digest (what `ctr images ls` and `docker images` show as the
	// image ID).
	Digest, ID v1.Hash
}

// Build assembles img in memory.
func Build(img Image) (v1.Image, error) {
	manifestType, configType, layerType := types.DockerManifestSchema2, types.DockerConfigJSON, types.DockerLayer
	if img.OCI {
		manifestType, configType, layerType = types.OCIManifestSchema1, types.OCIConfigJSON, types.OCILayer
	}
	out := mutate.MediaType(empty.Image, manifestType)
	out = mutate.ConfigMediaType(out, configType)
	for i, entries := range img.Layers {
		data, err := layerTar(entries)
		if err != nil {
			return nil, fmt.Errorf("image %s: layer %d: %w", img.Ref, i, err)
		}
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(data)), nil
		}, tarball.WithMediaType(layerType))
		if err != nil {
			return nil, fmt.Errorf("image %s: layer %d: %w", img.Ref, i, err)
		}
		if out, err = mutate.Append(out, mutate.Addendum{Layer: layer, History: v1.History{
			Created:   v1.Time{Time: epoch},
			CreatedBy: fmt.Sprintf("kp test/image layer %d", i),
		}}); err != nil {
			return nil, fmt.Errorf("image %s: layer %d: %w", img.Ref, i, err)
		}
	}
	cfg, err := out.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", img.Ref, err)
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS = cmp.Or(img.Arch, "amd64"), "linux"
	cfg.Created = v1.Time{Time: epoch}
	cfg.Config.Entrypoint = img.Entrypoint
	cfg.Config.Cmd = img.Cmd
	cfg.Config.Env = img.Env
	cfg.Config.WorkingDir = img.WorkingDir
	cfg.Config.User = img.User
	cfg.Config.Labels = img.Labels
	if out, err = mutate.ConfigFile(out, cfg); err != nil {
		return nil, fmt.Errorf("image %s: %w", img.Ref, err)
	}
	return out, nil
}

// Write builds every image and writes them into one Docker-format tarball at
// dst (replaced if it exists).
func Write(dst string, imgs ...Image) ([]Written, error) {
	refs := make(map[name.Reference]v1.Image, len(imgs))
	written := make([]Written, 0, len(imgs))
	for _, img := range imgs {
		ref, err := name.NewTag(img.Ref, name.StrictValidation)
		if err != nil {
			return nil, fmt.Errorf("image %q: reference: %w", img.Ref, err)
		}
		built, err := Build(img)
		if err != nil {
			return nil, err
		}
		w := Written{Ref: img.Ref}
		if w.Digest, err = built.Digest(); err != nil {
			return nil, fmt.Errorf("image %s: %w", img.Ref, err)
		}
		if w.ID, err = built.ConfigName(); err != nil {
			return nil, fmt.Errorf("image %s: %w", img.Ref, err)
		}
		refs[ref] = built
		written = append(written, w)
	}
	tmp := dst + ".tmp"
	if err := tarball.MultiRefWriteToFile(tmp, refs); err != nil {
		os.Remove(tmp)
		return nil, fmt.Errorf("write %s: %w", dst, err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return nil, err
	}
	return written, nil
}

// layerTar writes entries, and every parent directory they imply, as one
// uncompressed tar in path order.
func layerTar(entries []Entry) ([]byte, error) {
	byPath := make(map[string]Entry, len(entries))
	for _, e := range entries {
		p := path.Clean("/" + e.Path)
		if p == "/" {
			continue
		}
		e.Path = p
		if prev, dup := byPath[p]; dup && !(prev.Mode.IsDir() && e.Mode.IsDir()) {
			return nil, fmt.Errorf("%s: listed twice", p)
		}
		byPath[p] = e
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if _, ok := byPath[d]; !ok {
				byPath[d] = Dir(d)
			}
		}
	}
	paths := make([]string, 0, len(byPath))
	for p := range byPath {
		paths = append(paths, p)
	}
	slices.Sort(paths)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		e := byPath[p]
		hdr := &tar.Header{
			Name:    strings.TrimPrefix(p, "/"),
			ModTime: epoch,
			Format:  tar.FormatPAX,
		}
		var body []byte
		switch {
		case e.Mode&fs.ModeSymlink != 0:
			hdr.Typeflag, hdr.Linkname, hdr.Mode = tar.TypeSymlink, e.Link, 0o777
		case e.Mode.IsDir():
			hdr.Typeflag, hdr.Mode = tar.TypeDir, int64(perm(e.Mode, 0o755))|special(e.Mode)
			hdr.Name += "/"
		default:
			body = e.Data
			def := fs.FileMode(0o644)
			if e.Source != "" {
				st, err := os.Stat(e.Source)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", p, err)
				}
				if !st.Mode().IsRegular() {
					return nil, fmt.Errorf("%s: source %s is not a regular file", p, e.Source)
				}
				if st.Mode()&0o111 != 0 {
					def = 0o755
				}
				if body, err = os.ReadFile(e.Source); err != nil {
					return nil, fmt.Errorf("%s: %w", p, err)
				}
			}
			hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeReg, int64(perm(e.Mode, def))|special(e.Mode), int64(len(body))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if _, err := tw.Write(body); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// perm returns m's permission bits, or def when it has none.
func perm(m, def fs.FileMode) fs.FileMode {
	if p := m.Perm(); p != 0 {
		return p
	}
	return def
}

// special returns m's setuid, setgid and sticky bits as tar mode bits (a
// sticky /tmp, for one).
func special(m fs.FileMode) int64 {
	var bits int64
	if m&fs.ModeSetuid != 0 {
		bits |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		bits |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		bits |= 0o1000
	}
	return bits
}
