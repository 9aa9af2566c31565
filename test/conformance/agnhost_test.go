package conformance

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// shAsBash writes, into dir, the image of tarball (reference ref) with one
// more layer in which /bin/sh is bash, and returns the new tarball's path.
//
// Why: the agnhost image's /bin/sh is Debian's busybox-static, built with
// FEATURE_SH_STANDALONE: its shell runs its own applets before PATH, so
// `sh -c "… | nc -v -t -w 2 host port"`, how upstream's Services tests
// probe a Service, runs busybox's nc (no -v, no -t) instead of the image's
// /usr/bin/nc (OpenBSD netcat) and every such probe fails, whatever the
// proxy. Upstream's agnhost (Alpine) has a busybox without that option.
// bash is in the image and finds nc by PATH.
func shAsBash(dir, path, ref string) (string, error) {
	tag, err := name.NewTag(ref)
	if err != nil {
		return "", err
	}
	img, err := tarball.ImageFromPath(path, &tag)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/sh", Linkname: "bash", Mode: 0o777}); err != nil {
		return "", err
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b.Bytes())), nil
	}, tarball.WithMediaType(types.DockerLayer))
	if err != nil {
		return "", err
	}
	out, err := mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{
		CreatedBy: "kp test/conformance: /bin/sh is bash (busybox-static's shell prefers its applets to PATH)",
	}})
	if err != nil {
		return "", err
	}
	dst := filepath.Join(dir, filepath.Base(path))
	if err := tarball.WriteToFile(dst, tag, out); err != nil {
		return "", fmt.Errorf("write %s: %w", dst, err)
	}
	return dst, nil
}
