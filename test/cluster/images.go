package cluster

import (
	"fmt"
	"os"
	"os/exec"

	"github.com/kpproxy/kp/test/image"
	"github.com/kpproxy/kp/test/netns"
)

// Image references of the images the harness builds. Dotted names:
// containerd would turn a bare "pause" into docker.io/library/pause.
const (
	PauseRef = "kp.local/pause:e2e"
	EchoRef  = "kp.local/echo:e2e"
)

// PauseImage is the sandbox image every node's containerd runs each pod's
// namespaces in: test/pause, built statically.
func PauseImage() (image.Image, error) {
	bin, err := netns.BuildStatic("./test/pause")
	if err != nil {
		return image.Image{}, err
	}
	return image.Image{
		Ref:        PauseRef,
		Layers:     [][]image.Entry{{image.File("/pause", bin)}},
		Entrypoint: []string{"/pause"},
	}, nil
}

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

// KPImage is kp's image for the tests: the static kp binary at
// /usr/local/bin/kp, kp-top linking to it, kp as the entrypoint.
//
// A stand-in until the project's own image builder (make image) lands:
// swap this one function for it. kp's nftables mode needs no other file.
func KPImage(binary, ref string) image.Image {
	return image.Image{
		Ref: ref,
		Layers: [][]image.Entry{{
			image.File("/usr/local/bin/kp", binary),
			image.Symlink("/usr/local/bin/kp-top", "kp"),
		}},
		Entrypoint: []string{"/usr/local/bin/kp"},
	}
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
