package conformance

import (
	"archive/tar"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// wgetShim is /usr/bin/wget in the fixed agnhost image: the forms of wget
// upstream's network tests use (-q, -O -, -qO-, -T seconds), done by curl.
const wgetShim = `#!/bin/bash
# kp test/conformance: busybox-static's wget crashes (SIGSEGV) in this image;
# the forms upstream's tests use, done by curl, quiet as wget -q.
timeout=900
urls=()
while [ $# -gt 0 ]; do
	case "$1" in
	-q | -O- | -qO-) ;;
	-O) shift ;;
	-T) shift; timeout=$1 ;;
	-T*) timeout=${1#-T} ;;
	*) urls+=("$1") ;;
	esac
	shift
done
exec curl -s -f -m "$timeout" "${urls[@]}"
`

// fixAgnhost writes, into dir, the image of tarball (reference ref) with
// one more layer, and returns the new tarball's path. Two faults of the
// agnhost image built from Debian's busybox-static, each of which fails
// upstream's tests whatever the proxy, are mended there:
//
//   - its /bin/sh is busybox, built with FEATURE_SH_STANDALONE: the shell
//     runs its own applets before PATH, so `sh -c "… | nc -v -t -w 2 host
//     port"`, how the Services tests probe a Service, runs busybox's nc
//     (no -v, no -t) instead of the image's /usr/bin/nc (OpenBSD netcat).
//     Upstream's agnhost (Alpine) has a busybox without that option. In
//     the layer /bin/sh is the image's bash, which finds nc by PATH;
//   - its wget applet dies of SIGSEGV before it sends anything (after
//     getuid); the tests call wget from host-network pods. In the layer
//     /usr/bin/wget is a script that asks the image's curl;
//   - it lacks /localhost.crt and /localhost.key, upstream's, with which
//     `agnhost porter` serves its TLS ports (SERVE_TLS_PORT_*): the
//     Proxy test's https cases were refused. The layer has a self-signed
//     pair for localhost.
func fixAgnhost(dir, path, ref string) (string, error) {
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
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "usr/bin/wget", Mode: 0o755, Size: int64(len(wgetShim))}); err != nil {
		return "", err
	}
	if _, err := tw.Write([]byte(wgetShim)); err != nil {
		return "", err
	}
	crt, key, err := localhostPair()
	if err != nil {
		return "", err
	}
	for _, f := range []struct {
		name string
		data []byte
	}{{"localhost.crt", crt}, {"localhost.key", key}} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: 0o644, Size: int64(len(f.data))}); err != nil {
			return "", err
		}
		if _, err := tw.Write(f.data); err != nil {
			return "", err
		}
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
		CreatedBy: "kp test/conformance: /bin/sh is bash, wget is curl (busybox-static's shell prefers its applets, its wget crashes); /localhost.crt and .key for porter's TLS ports",
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

// localhostPair is a self-signed certificate for localhost and its key,
// PEM-encoded.
func localhostPair() (crt, key []byte, err error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}
