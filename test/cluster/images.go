package cluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/kpproxy/kp/test/image"
	"github.com/kpproxy/kp/test/netns"
)

// EchoRef names the workload image the harness builds. A dotted name:
// containerd would turn a bare "echo" into docker.io/library/echo.
const EchoRef = "kp.local/echo:e2e"

// EchoImage is the workload image: test/echo (a static binary, at /echo),
// which answers every connection with its -name and the client's address.
func EchoImage() (image.Image, error) {
	bin, err := netns.BuildStatic("./test/echo")
	if err != nil {
		return image.Image{}, err
	}
	return image.Image{
		Ref:        EchoRef,
		Layers:     [][]image.Entry{{image.File("/echo", bin)}},
		Entrypoint: []string{"/echo"},
	}, nil
}

// KPImage is kp's image as `make image` builds it (image.KP: the binary,
// kp-top, and the iptables and ipset tools from Debian's packages), named
// ref. Without apt's lists or the network the packages cannot be fetched:
// the test is skipped then, and fails under CI.
func KPImage(t testing.TB, binary, ref string) image.Image {
	t.Helper()
	img, err := image.KP(binary, ref)
	if errors.Is(err, image.ErrDownload) && os.Getenv("CI") == "" {
		t.Skipf("skipped: kp's image: %v", err)
	}
	if err != nil {
		t.Fatalf("kp's image: %v", err)
	}
	return img
}

// writeImages writes imgs into one Docker tarball in dir and returns its
// path.
func writeImages(dir string, imgs ...image.Image) (string, error) {
	refs := make([]string, len(imgs))
	for i, img := range imgs {
		refs[i] = img.Ref
	}
	f, err := os.CreateTemp(dir, "images-*.tar")
	if err != nil {
		return "", err
	}
	f.Close()
	if _, err := image.Write(f.Name(), imgs...); err != nil {
		return "", fmt.Errorf("images %v: %w", refs, err)
	}
	return f.Name(), nil
}

// importImages imports a Docker tarball into containerd at socket, in the
// namespace its CRI plugin uses, unpacked for its snapshotter.
func importImages(socket, tarball string) error {
	out, err := exec.Command("ctr", "--address", socket, "--namespace", "k8s.io", "images", "import", tarball).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr images import %s: %w\n%s", tarball, err, out)
	}
	return nil
}
