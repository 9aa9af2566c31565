package image

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// privateContainerd starts a containerd of the test's own: its own root,
// state and socket in a temporary directory, no CRI (no kubelet talks to
// it). It is stopped, and whatever it mounted is unmounted, when the test
// ends, pass or fail. It returns the socket's path.
func privateContainerd(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		unavailable(t, "skipped: containerd needs root")
	}
	for _, tool := range []string{"containerd", "ctr"} {
		if _, err := exec.LookPath(tool); err != nil {
			unavailable(t, "skipped: needs %s on the PATH (apt-get install containerd)", tool)
		}
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "containerd.sock")
	config := fmt.Sprintf(`version = 2
root = %q
state = %q
temp = %q
disabled_plugins = ["io.containerd.grpc.v1.cri"]

[grpc]
  address = %q

[plugins."io.containerd.internal.v1.opt"]
  path = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), filepath.Join(dir, "tmp"), sock, filepath.Join(dir, "opt"))
	if err := os.Mkdir(filepath.Join(dir, "tmp"), 0o700); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "containerd.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("containerd", "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("start containerd: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		logFile.Close()
		unmountUnder(t, dir)
		if t.Failed() {
			if log, err := os.ReadFile(logPath); err == nil {
				t.Logf("containerd's log:\n%s", log)
			}
		}
	})

	deadline := time.Now().Add(30 * time.Second)
	for {
		err := exec.Command("ctr", "--address", sock, "version").Run()
		if err == nil {
			return sock
		}
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("containerd exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd not answering on %s after 30s: %v", sock, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// unmountUnder detaches any mount left below dir (containerd mounts layers
// to unpack them, and a killed one may leave one behind), so the temporary
// directory can be removed.
func unmountUnder(t *testing.T, dir string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	var mounts []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		// Field 5 is the mount point.
		if fields := strings.Fields(s.Text()); len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			mounts = append(mounts, fields[4])
		}
	}
	// Deepest first.
	for i := len(mounts) - 1; i >= 0; i-- {
		if err := syscall.Unmount(mounts[i], syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s left by containerd: %v", mounts[i], err)
		}
	}
}

func TestKPImageTarballLoadsIntoContainerd(t *testing.T) {
	tarball := kpTarball(t)
	sock := privateContainerd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ctr := func(args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, "ctr", append([]string{"--address", sock, "--namespace", "k8s.io"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("ctr %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	// As on a node: into the namespace the kubelet's images live in, and
	// unpacked (the default), so a pod could start from it.
	ctr("images", "import", tarball)
	if refs := strings.Fields(ctr("images", "ls", "-q")); !slices.Contains(refs, testRef) {
		t.Fatalf("ctr images ls: %q, want %s", refs, testRef)
	}
	if out := ctr("images", "check"); !strings.Contains(out, "complete") {
		t.Errorf("ctr images check: the image is not complete:\n%s", out)
	}
}

// The release's image index (both architectures, one OCI tarball) loads
// into containerd for each platform, as a node of either architecture
// would import it, under the reference and index digest it was written
// with; each platform brings its own manifest, configuration and layers.
func TestKPImageIndexLoadsIntoContainerdForEachPlatform(t *testing.T) {
	const ref = "kp.local/kp:index-test"
	imgs := map[string]Image{"amd64": kpImageFor(t, "amd64"), "arm64": kpImageFor(t, "arm64")}
	dst := filepath.Join(t.TempDir(), "kp-image.oci.tar")
	written, err := WriteIndex(dst, Index{Ref: ref, Images: []Image{imgs["amd64"], imgs["arm64"]}})
	if err != nil {
		t.Fatal(err)
	}
	sock := privateContainerd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, arch := range []string{"amd64", "arm64"} {
		t.Run(arch, func(t *testing.T) {
			// A namespace per platform: each sees only what its import
			// brought.
			ctr := func(args ...string) string {
				t.Helper()
				out, err := exec.CommandContext(ctx, "ctr", append([]string{"--address", sock, "--namespace", "import-" + arch}, args...)...).CombinedOutput()
				if err != nil {
					t.Fatalf("ctr %s: %v\n%s", strings.Join(args, " "), err, out)
				}
				return string(out)
			}
			ctr("images", "import", "--platform", "linux/"+arch, dst)
			var line []string
			for _, l := range strings.Split(ctr("images", "ls"), "\n") {
				if f := strings.Fields(l); len(f) > 0 && f[0] == ref {
					line = f
				}
			}
			// REF TYPE DIGEST SIZE PLATFORMS LABELS
			if len(line) < 5 || line[2] != written.Digest.String() || line[1] != "application/vnd.oci.image.index.v1+json" {
				t.Fatalf("ctr images ls: %q, want %s as an OCI index of digest %s", line, ref, written.Digest)
			}
			if !strings.Contains(line[len(line)-2]+line[len(line)-1], "linux/amd64,linux/arm64") {
				t.Errorf("ctr images ls: platforms of %q, want linux/amd64,linux/arm64", line)
			}
			content := ctr("content", "ls", "-q")
			manifest := written.Manifests[arch]
			if !strings.Contains(content, manifest.String()) {
				t.Errorf("the %s manifest %s is not in containerd after the import:\n%s", arch, manifest, content)
			}
			built, err := Build(imgs[arch])
			if err != nil {
				t.Fatal(err)
			}
			layers, err := built.Layers()
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range layers {
				d, _ := l.Digest()
				if !strings.Contains(content, d.String()) {
					t.Errorf("the %s layer %s is not in containerd after the import", arch, d)
				}
			}
		})
	}
}
