package image

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Index is one image for several architectures: an OCI image index whose
// manifests are Images, one per Arch, built with OCI media types.
type Index struct {
	// Ref names the index in the tarball, e.g. ghcr.io/kpproxy/kp:v0.1.0.
	Ref    string
	Images []Image
	// Annotations are the image index's (org.opencontainers.image.*).
	Annotations map[string]string
}

// WrittenIndex reports an index tarball.
type WrittenIndex struct {
	Ref string
	// Digest is the image index's: what a registry serves for Ref once
	// the tarball is pushed as it is, and what `image: repo@digest` pins.
	Digest v1.Hash
	// Manifests are the digests of each architecture's image manifest.
	Manifests map[string]v1.Hash
}

// WriteIndex writes idx as an OCI image layout in one tarball at dst
// (replaced if it exists): oci-layout, index.json naming the image index
// (org.opencontainers.image.ref.name: the tag; io.containerd.image.name:
// the whole reference, which `ctr images import` names the image by), and
// blobs/sha256/ holding the index, each image's manifest, configuration
// and gzipped layers. `ctr images import --all-platforms`, `skopeo copy
// --all oci-archive:...` and `crane push` (of the unpacked layout) take it.
// Entries are in path order with one time stamp and owner, so the same
// images give the same file.
func WriteIndex(dst string, idx Index) (WrittenIndex, error) {
	tag, err := name.NewTag(idx.Ref, name.StrictValidation)
	if err != nil {
		return WrittenIndex{}, fmt.Errorf("index %q: reference: %w", idx.Ref, err)
	}
	out := WrittenIndex{Ref: idx.Ref, Manifests: map[string]v1.Hash{}}
	ii := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	blobs := map[v1.Hash]func() (io.ReadCloser, error){}
	addBytes := func(b []byte, err error) error {
		if err != nil {
			return err
		}
		h, _, err := v1.SHA256(bytes.NewReader(b))
		if err != nil {
			return err
		}
		blobs[h] = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
		return nil
	}
	for _, img := range idx.Images {
		img.OCI = true
		built, err := Build(img)
		if err != nil {
			return WrittenIndex{}, err
		}
		cfg, err := built.ConfigFile()
		if err != nil {
			return WrittenIndex{}, fmt.Errorf("index %s: %w", idx.Ref, err)
		}
		if _, dup := out.Manifests[cfg.Architecture]; dup {
			return WrittenIndex{}, fmt.Errorf("index %s: two images for %s", idx.Ref, cfg.Architecture)
		}
		if out.Manifests[cfg.Architecture], err = built.Digest(); err != nil {
			return WrittenIndex{}, fmt.Errorf("index %s: %w", idx.Ref, err)
		}
		if err := addBytes(built.RawManifest()); err != nil {
			return WrittenIndex{}, fmt.Errorf("index %s: manifest: %w", idx.Ref, err)
		}
		if err := addBytes(built.RawConfigFile()); err != nil {
			return WrittenIndex{}, fmt.Errorf("index %s: config: %w", idx.Ref, err)
		}
		layers, err := built.Layers()
		if err != nil {
			return WrittenIndex{}, fmt.Errorf("index %s: %w", idx.Ref, err)
		}
		for _, l := range layers {
			d, err := l.Digest()
			if err != nil {
				return WrittenIndex{}, fmt.Errorf("index %s: layer: %w", idx.Ref, err)
			}
			blobs[d] = l.Compressed
		}
		ii = mutate.AppendManifests(ii, mutate.IndexAddendum{Add: built, Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: cfg.OS, Architecture: cfg.Architecture},
		}})
	}
	if len(idx.Annotations) > 0 {
		ii = mutate.Annotations(ii, idx.Annotations).(v1.ImageIndex)
	}
	raw, err := ii.RawManifest()
	if err != nil {
		return WrittenIndex{}, fmt.Errorf("index %s: %w", idx.Ref, err)
	}
	if err := addBytes(raw, nil); err != nil {
		return WrittenIndex{}, err
	}
	if out.Digest, err = ii.Digest(); err != nil {
		return WrittenIndex{}, fmt.Errorf("index %s: %w", idx.Ref, err)
	}
	top, err := json.Marshal(v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType: types.OCIImageIndex,
			Digest:    out.Digest,
			Size:      int64(len(raw)),
			Annotations: map[string]string{
				"org.opencontainers.image.ref.name": tag.TagStr(),
				"io.containerd.image.name":          tag.Name(),
			},
		}},
	})
	if err != nil {
		return WrittenIndex{}, err
	}
	if err := writeLayout(dst, top, blobs); err != nil {
		return WrittenIndex{}, fmt.Errorf("write %s: %w", dst, err)
	}
	return out, nil
}

// writeLayout writes an OCI image layout as a tarball: oci-layout,
// index.json, then the blobs in digest order.
func writeLayout(dst string, index []byte, blobs map[v1.Hash]func() (io.ReadCloser, error)) error {
	tmp := dst + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	tw := tar.NewWriter(f)
	dir := func(p string) error {
		return tw.WriteHeader(&tar.Header{Name: p, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX})
	}
	file := func(p string, size int64, r io.Reader) error {
		if err := tw.WriteHeader(&tar.Header{Name: p, Typeflag: tar.TypeReg, Mode: 0o644, Size: size, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
		n, err := io.Copy(tw, r)
		if err == nil && n != size {
			err = fmt.Errorf("%s: %d bytes, want %d", p, n, size)
		}
		return err
	}
	layout := `{"imageLayoutVersion":"1.0.0"}`
	if err := file("oci-layout", int64(len(layout)), strings.NewReader(layout)); err != nil {
		return err
	}
	if err := file("index.json", int64(len(index)), bytes.NewReader(index)); err != nil {
		return err
	}
	if err := dir("blobs/"); err != nil {
		return err
	}
	if err := dir("blobs/sha256/"); err != nil {
		return err
	}
	digests := make([]v1.Hash, 0, len(blobs))
	for d := range blobs {
		digests = append(digests, d)
	}
	slices.SortFunc(digests, func(a, b v1.Hash) int { return strings.Compare(a.Hex, b.Hex) })
	for _, d := range digests {
		// A blob's size is known only once read: read it once into
		// memory (the largest, kp's layer, is tens of MiB).
		rc, err := blobs[d]()
		if err != nil {
			return fmt.Errorf("blob %s: %w", d, err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return fmt.Errorf("blob %s: %w", d, err)
		}
		if got, _, _ := v1.SHA256(bytes.NewReader(b)); got != d {
			return fmt.Errorf("blob %s: content hashes to %s", d, got)
		}
		if err := file("blobs/sha256/"+d.Hex, int64(len(b)), bytes.NewReader(b)); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}
