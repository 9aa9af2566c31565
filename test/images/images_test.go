package images

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kpproxy/kp/test/netns"
)

func TestDirsAreTheOnesTheScriptsBuild(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		netns.Unavailable(t, "skipped: the scripts need go on PATH")
	}
	repo, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for script, dirFn := range map[string]func() (string, error){
		"test/k8s/images.sh":           Dir,
		"test/k8s/conformance-bins.sh": ConformanceDir,
	} {
		out, err := exec.Command("bash", filepath.Join(repo, script), "--dir").Output()
		if err != nil {
			t.Fatalf("%s --dir: %v", script, err)
		}
		want, err := dirFn()
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(out)); got != want {
			t.Errorf("%s builds into %s, the helper looks in %s", script, got, want)
		}
	}
}

func TestEveryImageLoadsUnderItsRefAndItsProgramsRun(t *testing.T) {
	imgs := All(t)
	if os.Getuid() != 0 {
		netns.Unavailable(t, "skipped: running the images' programs needs chroot, so root")
	}
	// What each image must run, inside its own file system; want is a
	// string its output must hold.
	checks := map[string][]struct {
		args []string
		want string
	}{
		CoreDNS: {{[]string{"/coredns", "-version"}, "CoreDNS-"}, {[]string{"/coredns", "-plugins"}, "kubernetes"}},
		Agnhost: {
			{[]string{"/agnhost", "--help"}, "netexec"},
			{[]string{"/bin/sh", "-c", "curl --version; nc -h 2>&1; dig -v 2>&1; ip -V; bash -c 'echo bash ok'"}, "bash ok"},
			{[]string{"/coredns", "-version"}, "CoreDNS-"},
			{[]string{"getent", "passwd", "user-defined-in-image"}, "user-defined-in-image:x:1000"},
			// What mends the busybox-static base for upstream's tests:
			// sh is bash (busybox's would run its own nc), wget is
			// curl (busybox's crashes), porter's TLS pair.
			{[]string{"/bin/sh", "-c", "echo bash $BASH_VERSION; grep -c curl /usr/bin/wget; grep -c CERTIFICATE /localhost.crt; grep -c PRIVATE /localhost.key"}, "bash 5"},
		},
		BusyBox: {{[]string{"/bin/busybox", "sh", "-c", "echo ok"}, "ok"}, {[]string{"sh", "-c", "sleep 0; wget --help 2>&1; echo ok"}, "Usage: wget"}},
		Pause:   {{[]string{"/pause", "-v"}, "pause"}},
		// The querier's loop of upstream's DNS tests, its names from
		// /etc/hosts through glibc's resolver (nsswitch.conf: files
		// first).
		GlibcDNSTesting: {
			{[]string{"sh", "-c", "for i in `seq 1 2`; do sleep 0; done; dig -v 2>&1; nslookup -version; host -V 2>&1; echo sh ok"}, "sh ok"},
			{[]string{"sh", "-c", "echo '10.9.8.7 querier.kp.test' >>/etc/hosts; getent hosts querier.kp.test"}, "10.9.8.7"},
			{[]string{"/coredns", "-version"}, "CoreDNS-"},
		},
		// What upstream's CLOSE_WAIT test runs through /bin/sh -c, and
		// the tools upstream's image has; talking to the kernel is
		// TestDistrolessIptablesToolsReadANamespacesTables's.
		DistrolessIptables: {
			{[]string{"sleep", "0"}, ""},
			{[]string{"/bin/sh", "-c", "test -f /etc/nonesuch || which conntrack; echo 'CLOSE_WAIT dport=11302' | grep -m 1 -E 'CLOSE_WAIT.*dport=11302'"}, "/usr/sbin/conntrack\nCLOSE_WAIT dport=11302"},
			{[]string{"conntrack", "--version"}, "conntrack v1."},
			{[]string{"iptables", "-V"}, "(nf_tables)"},
			{[]string{"sh", "-c", "ip6tables-save -V; iptables-legacy -V; nft -v; ipset version; modprobe -V; cat /dev/null | wc -l"}, "kmod version"},
		},
	}
	seen := map[string]bool{}
	for _, img := range imgs {
		seen[img.Name] = true
		t.Run(img.Name, func(t *testing.T) {
			root := extract(t, img)
			for _, c := range checks[img.Name] {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				cmd := exec.CommandContext(ctx, "chroot", append([]string{root}, c.args...)...)
				cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
				out, err := cmd.CombinedOutput()
				cancel()
				if err != nil || !strings.Contains(string(out), c.want) {
					t.Errorf("%s in %s: %v, output (want %q):\n%s", strings.Join(c.args, " "), img.Ref, err, c.want, out)
				}
			}
		})
	}
	for name := range checks {
		if !seen[name] {
			t.Errorf("images.txt has no %s image", name)
		}
	}
}

func TestPauseAsPID1ExitsZeroOnSIGTERM(t *testing.T) {
	bin := Bin(t, "pause")
	if os.Getuid() != 0 {
		netns.Unavailable(t, "skipped: a PID namespace needs root")
	}
	// As a pod's PID 1, as in a sandbox: the kernel delivers PID 1 only
	// the signals it handles, so a pause that forgot to would never stop.
	cmd := exec.Command(bin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	time.Sleep(200 * time.Millisecond)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("pause after SIGTERM: %v (stderr %q), want exit 0", err, stderr.String())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("pause still runs 5 s after SIGTERM")
	}
}

func TestTarballsImportIntoContainerd(t *testing.T) {
	imgs := All(t)
	if os.Getuid() != 0 {
		netns.Unavailable(t, "skipped: containerd needs root")
	}
	containerd, err := exec.LookPath("containerd")
	if err != nil {
		netns.Unavailable(t, "skipped: containerd is not installed (Debian: apt-get install containerd)")
	}
	ctr, err := exec.LookPath("ctr")
	if err != nil {
		netns.Unavailable(t, "skipped: ctr is not installed")
	}
	// A private containerd: its own root, state and sockets, no CRI (no
	// CNI, nothing listening on the network), the opt plugin's directory
	// inside the temporary one instead of /opt/containerd.
	dir, err := os.MkdirTemp("", "kp-containerd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unmountUnder(t, dir)
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove containerd's directory: %v", err)
		}
	})
	sock := filepath.Join(dir, "containerd.sock")
	config := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock, sock+".ttrpc", filepath.Join(dir, "opt"))
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	daemon := exec.Command(containerd, "--config", filepath.Join(dir, "config.toml"))
	daemon.Stdout, daemon.Stderr = logf, logf
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	// Registered after the directory's cleanup, so it runs first.
	t.Cleanup(func() {
		daemon.Process.Signal(syscall.SIGTERM)
		waited := make(chan struct{})
		go func() { daemon.Wait(); close(waited) }()
		select {
		case <-waited:
		case <-time.After(10 * time.Second):
			daemon.Process.Kill()
			<-waited
		}
		if t.Failed() {
			if log, err := os.ReadFile(filepath.Join(dir, "containerd.log")); err == nil {
				t.Logf("containerd's log:\n%s", log)
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	run := func(args ...string) (string, error) {
		out, err := exec.CommandContext(ctx, ctr, append([]string{"--address", sock, "--namespace", "k8s.io"}, args...)...).CombinedOutput()
		return string(out), err
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := run("version"); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("containerd did not answer on %s in 20 s: %v", sock, err)
		}
	}
	if err := Import(ctx, ctr, sock, imgs...); err != nil {
		t.Fatal(err)
	}
	out, err := run("images", "ls", "-q")
	if err != nil {
		t.Fatalf("ctr images ls: %v\n%s", err, out)
	}
	listed := strings.Fields(out)
	for _, img := range imgs {
		found := false
		for _, ref := range listed {
			found = found || ref == img.Ref
		}
		if !found {
			t.Errorf("%s not in containerd's images after import: %v", img.Ref, listed)
		}
	}
}

// extract unpacks img, loaded from its tarball by its reference, into a
// temporary directory and returns it.
func extract(t *testing.T, img Image) string {
	t.Helper()
	tag, err := name.NewTag(img.Ref, name.StrictValidation)
	if err != nil {
		t.Fatalf("%s: %v", img.Ref, err)
	}
	loaded, err := tarball.ImageFromPath(img.Tarball, &tag)
	if err != nil {
		t.Fatalf("load %s from %s: %v", img.Ref, img.Tarball, err)
	}
	cfg, err := loaded.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.OS != "linux" || cfg.Architecture != "amd64" || len(cfg.Config.Entrypoint)+len(cfg.Config.Cmd) == 0 {
		t.Errorf("%s: config %s/%s, entrypoint %q, cmd %q", img.Ref, cfg.OS, cfg.Architecture, cfg.Config.Entrypoint, cfg.Config.Cmd)
	}
	root := t.TempDir()
	rc := mutate.Extract(loaded)
	defer rc.Close()
	if err := untar(rc, root); err != nil {
		t.Fatalf("extract %s: %v", img.Ref, err)
	}
	return root
}

// untar writes a flattened image's directories, regular files and links
// under root. Image paths are trusted (these images are built here) but
// still kept inside root.
func untar(r io.Reader, root string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		p := filepath.Join(root, filepath.Clean("/"+h.Name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, h.FileInfo().Mode().Perm()); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.Symlink(h.Linkname, p); err != nil {
				return err
			}
		case tar.TypeReg:
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, h.FileInfo().Mode().Perm())
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: unexpected tar entry type %c", h.Name, h.Typeflag)
		}
	}
}

// unmountUnder unmounts whatever is still mounted below dir (snapshots a
// killed containerd left), deepest first.
func unmountUnder(t *testing.T, dir string) {
	data, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Errorf("read mounts: %v", err)
		return
	}
	var mounts []string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[1], dir+"/") {
			mounts = append(mounts, f[1])
		}
	}
	for i := len(mounts) - 1; i >= 0; i-- {
		if err := syscall.Unmount(mounts[i], syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", mounts[i], err)
		}
	}
}

func TestConformanceBinariesReportThePinnedVersions(t *testing.T) {
	kube, err := KubeVersion()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		bin  string
		args []string
		want string
	}{
		{E2ETest, []string{"--version"}, kube},
		{Ginkgo, []string{"version"}, "Ginkgo Version 2."},
	} {
		out, err := exec.Command(ConformanceBin(t, c.bin), c.args...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), c.want) {
			t.Errorf("%s %s: %v, output (want %q):\n%s", c.bin, strings.Join(c.args, " "), err, c.want, out)
		}
	}
}
