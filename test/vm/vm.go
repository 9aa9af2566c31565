package vm

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kpproxy/kp/test/netns"
	"github.com/kpproxy/kp/test/vm/internal/boot"
)

const (
	qemuBin = "qemu-system-x86_64"
	// virtiofsd is qemu 7.2's C daemon (Debian 12's qemu-system-common);
	// Debian 12 has no separate virtiofsd package.
	virtiofsdBin = "/usr/lib/qemu/virtiofsd"
)

// outputPort names the virtio serial port of the command's output.
const outputPort = "kp.out"

// DefaultModules are loaded before the command runs: what kp's modes and
// their tests use. The guest's init also answers the kernel's own module
// requests, so this list is about speed and about modules nothing requests
// (br_netfilter).
var DefaultModules = []string{
	"ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_lc", "ip_vs_sh", "ip_vs_mh",
	"dummy", "veth", "bridge", "br_netfilter", "nf_conntrack", "nf_nat",
	"nf_tables", "nft_chain_nat", "nft_ct", "nft_nat", "nft_masq", "nft_reject_inet",
	"ip_tables", "ip6_tables", "iptable_nat", "iptable_filter", "ip_set",
}

// writable are the root's folders the guest overlays with a tmpfs: it sees
// the host's files and may change them, and nothing reaches the host.
var writable = []string{"/etc", "/var", "/tmp", "/root", "/home", "/mnt", "/opt", "/srv"}

// Options shape one boot; the zero value is a sensible VM.
type Options struct {
	// Timeout bounds the whole boot, command and power-off; qemu is killed
	// after it. Default 5 minutes.
	Timeout time.Duration
	// CPUs and MemoryMiB size the VM: default 2 and 2048.
	CPUs, MemoryMiB int
	// Modules are loaded (with dependencies) before the command; nil means
	// DefaultModules.
	Modules []string
	// Env is added to the command's environment (PATH, HOME, KP_VM=1 and
	// the host's CI are set already).
	Env []string
	// Dir is the command's working folder: default /.
	Dir string
}

func (o *Options) defaults() {
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Minute
	}
	if o.CPUs == 0 {
		o.CPUs = 2
	}
	if o.MemoryMiB == 0 {
		o.MemoryMiB = 2048
	}
	if o.Modules == nil {
		o.Modules = DefaultModules
	}
	if o.Dir == "" {
		o.Dir = "/"
	}
}

// ExitError is a command that ran in the VM and failed.
type ExitError struct{ Code int }

func (e *ExitError) Error() string { return fmt.Sprintf("exit status %d in the VM", e.Code) }

// Run boots the VM kernel, runs binary (a host path, e.g. from BuildTest)
// with args inside it as root, and returns what the command wrote to stdout
// and stderr. The error is an *ExitError when the command failed, or says
// why the VM did not carry a status back (with the console's tail). It
// skips t as Require does when the VM cannot run here.
func Run(t testing.TB, opts Options, binary string, args ...string) (string, error) {
	t.Helper()
	k := Require(t)
	opts.defaults()
	start := time.Now()
	sweepStale()
	// The pid in the name lets sweepStale remove it if this process is killed.
	dir, err := os.MkdirTemp("", fmt.Sprintf("kp-vm-%d-", os.Getpid()))
	if err != nil {
		return "", fmt.Errorf("vm: %w", err)
	}
	defer os.RemoveAll(dir)

	initBin, err := netns.BuildStatic("./test/vm/cmd/kp-vm-init")
	if err != nil {
		return "", fmt.Errorf("vm: %w", err)
	}
	if err := copyFile(filepath.Join(dir, "init"), initBin, 0o755); err != nil {
		return "", err
	}
	initrd := filepath.Join(dir, "initrd.cpio")
	if _, err := writeInitramfs(initrd, initBin, k.ModulesDir, k.Index); err != nil {
		return "", err
	}
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "KP_VM=1"}
	if ci := os.Getenv("CI"); ci != "" {
		env = append(env, "CI="+ci)
	}
	cfg := boot.Config{
		ModulesDir: k.ModulesDir, Index: k.Index, Modules: opts.Modules,
		Overlays: writable, Tmpfs: []string{"/run"},
		Command: append([]string{binary}, args...), Env: append(env, opts.Env...), Dir: opts.Dir,
		OutputPort: outputPort,
	}
	if err := cfg.Write(dir); err != nil {
		return "", err
	}

	ctx, cancel := context.WithTimeout(context.Background(), opts.Timeout)
	defer cancel()
	sock := filepath.Join(dir, "fs.sock")
	fsd, err := startVirtiofsd(ctx, dir, sock)
	if err != nil {
		return "", err
	}
	defer func() { fsd.Process.Kill(); fsd.Wait() }()

	outFile := filepath.Join(dir, "out")
	qemu := exec.CommandContext(ctx, qemuBin, qemuArgs(opts, k, dir, initrd, sock, outFile)...)
	qemu.WaitDelay = 5 * time.Second
	qemu.SysProcAttr = dieWithTest()
	stdout, err := qemu.StdoutPipe()
	if err != nil {
		return "", fmt.Errorf("vm: %w", err)
	}
	var qerr strings.Builder
	qemu.Stderr = &qerr
	prep := time.Since(start)
	booted := time.Now()
	if err := qemu.Start(); err != nil {
		return "", fmt.Errorf("vm: start %s: %w", qemuBin, err)
	}
	con := readConsole(stdout)
	werr := qemu.Wait()
	<-con.done
	out, _ := os.ReadFile(outFile)
	output := string(out)
	for _, l := range con.lines {
		if _, step, ok := strings.Cut(l, "kp-vm-init: "); ok && strings.Contains(step, " at ") {
			t.Logf("vm: %s", step) // the boot's steps with the guest's uptime
		}
	}
	if con.ready.IsZero() {
		t.Logf("vm: no command started after %v; console:\n%s", time.Since(start).Round(time.Millisecond), con.tail())
	} else {
		t.Logf("vm: prepared in %v; kernel %s booted in %v; command and power-off took %v",
			prep.Round(time.Millisecond), k.Release, con.ready.Sub(booted).Round(time.Millisecond),
			time.Since(con.ready).Round(time.Millisecond))
	}
	if con.ready.IsZero() && con.code >= 0 {
		return output, fmt.Errorf("vm: the guest's init failed before the command (exit %d)\nconsole:\n%s", con.code, con.tail())
	}
	if con.code < 0 {
		why := "qemu exited"
		if ctx.Err() != nil {
			why = fmt.Sprintf("timed out after %v", opts.Timeout)
		}
		return output, fmt.Errorf("vm: no exit status from the guest (%s: %v; %s)\nconsole:\n%s",
			why, werr, strings.TrimSpace(qerr.String()), con.tail())
	}
	if con.code != 0 {
		return output, &ExitError{Code: con.code}
	}
	return output, nil
}

// sweepStale removes the run folders of test processes that are gone (killed
// before their deferred cleanup): their qemu and virtiofsd died with them
// (dieWithTest), and the read-only bind lived only in virtiofsd's mount
// namespace.
func sweepStale() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "kp-vm-*-*"))
	for _, d := range dirs {
		pid, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(d), "kp-vm-"), "-")
		if _, err := strconv.Atoi(pid); err != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join("/proc", pid)); os.IsNotExist(err) {
			os.RemoveAll(d)
		}
	}
}

// qemuArgs are one boot's qemu command line.
func qemuArgs(opts Options, k *Kernel, dir, initrd, sock, outFile string) []string {
	mem := strconv.Itoa(opts.MemoryMiB)
	return []string{
		// Software emulation only: -enable-kvm hangs on this machine.
		// qboot (Debian's qemu-system-data) starts the kernel sooner than
		// SeaBIOS: 1–3 s less under emulation, measured.
		"-machine", "pc,accel=tcg", "-cpu", "max", "-bios", "qboot.rom",
		"-smp", strconv.Itoa(opts.CPUs), "-m", mem,
		"-nographic", "-nic", "none", "-no-reboot",
		"-kernel", k.Image, "-initrd", initrd,
		// cryptomgr.notests: no crypto self-tests at boot (the Debian
		// kernel runs them; under emulation on a loaded machine one boot
		// spent its whole 8-minute start-up in them, soft lockups on the
		// console). The tests use no kernel crypto that matters.
		"-append", "console=ttyS0 quiet panic=-1 mitigations=off cryptomgr.notests kp.dir=" + dir,
		// The console (ttyS0) is qemu's stdout; the command's output goes
		// through a virtio serial port: an emulated UART moves ~25 KB/s
		// under TCG (measured: 4 MB of output took 2.5 minutes).
		"-serial", "mon:stdio",
		"-device", "virtio-serial-pci,id=vser",
		"-chardev", "file,id=out,path=" + outFile,
		"-device", "virtserialport,bus=vser.0,chardev=out,name=" + outputPort,
		// vhost-user devices need the guest's RAM shared with virtiofsd.
		"-object", "memory-backend-memfd,id=mem,size=" + mem + "M,share=on", "-numa", "node,memdev=mem",
		"-chardev", "socket,id=rootfs,path=" + sock,
		"-device", "vhost-user-fs-pci,chardev=rootfs,tag=root",
	}
}

// startVirtiofsd shares the host's root read-only: a bind mount of / made
// read-only in a private mount namespace (the C virtiofsd has no read-only
// option, and the guest's root is root), and only / itself: no /proc, /sys,
// /dev or /run/netns of the host's.
func startVirtiofsd(ctx context.Context, dir, sock string) (*exec.Cmd, error) {
	src := filepath.Join(dir, "root")
	if err := os.Mkdir(src, 0o755); err != nil {
		return nil, fmt.Errorf("vm: %w", err)
	}
	cmd := exec.CommandContext(ctx, "unshare", "--mount", "--propagation", "private", "sh", "-c",
		`mount --bind / "$1" && mount -o remount,bind,ro "$1" && exec "$3" --socket-path="$2" -o source="$1" -o cache=always -o sandbox=chroot`,
		"sh", src, sock, virtiofsdBin)
	var stderr syncBuilder
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	cmd.SysProcAttr = dieWithTest()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("vm: start virtiofsd: %w", err)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			return cmd, nil
		}
	}
	cmd.Process.Kill()
	cmd.Wait()
	return nil, fmt.Errorf("vm: virtiofsd made no socket %s in 10 s: %s", sock, stderr.String())
}

// console follows the guest's serial console for the markers kp-vm-init
// prints, keeping the last lines for error messages.
type console struct {
	done  chan struct{}
	ready time.Time
	code  int
	lines []string
}

func readConsole(r io.Reader) *console {
	c := &console{done: make(chan struct{}), code: -1}
	go func() {
		defer close(c.done)
		s := bufio.NewScanner(r)
		s.Buffer(make([]byte, 64<<10), 1<<20)
		for s.Scan() {
			line := strings.TrimRight(s.Text(), "\r")
			switch {
			case strings.Contains(line, boot.ReadyMarker):
				c.ready = time.Now()
			case strings.Contains(line, boot.ExitMarker):
				_, code, _ := strings.Cut(line, boot.ExitMarker)
				if n, err := strconv.Atoi(code); err == nil {
					c.code = n
				}
			}
			c.lines = append(c.lines, line)
			if len(c.lines) > 60 {
				c.lines = c.lines[1:]
			}
		}
	}()
	return c
}

func (c *console) tail() string { return strings.Join(c.lines, "\n") }

// RunPackage builds a package's tests (BuildTest) and runs those matching
// run (a -test.run pattern; empty runs all) in one boot, verbose, with any
// further test flags in args (e.g. "-test.parallel=4"). A failing test is an
// *ExitError with the output holding its log.
func RunPackage(t testing.TB, opts Options, pkg, run string, args ...string) (string, error) {
	t.Helper()
	Require(t)
	bin := BuildTest(t, pkg)
	flags := []string{"-test.v", "-test.count=1"}
	if run != "" {
		flags = append(flags, "-test.run", run)
	}
	return Run(t, opts, bin, append(flags, args...)...)
}

// BuildTest compiles a package's tests (`go test -c`, pkg relative to the
// module root, e.g. "./test/vm/probe") into t's temporary folder, which the
// VM sees through its /tmp overlay, and returns the binary's path.
func BuildTest(t testing.TB, pkg string) string {
	t.Helper()
	root, err := netns.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), filepath.Base(pkg)+".test")
	cmd := exec.Command("go", "test", "-c", "-o", out, pkg)
	cmd.Dir = root
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go test -c %s: %v\n%s", pkg, err, msg)
	}
	return out
}

// dieWithTest makes a VM's processes die with a killed test process; a
// canceled one kills them through the context. (Pdeathsig survives the
// execs of unshare and sh into virtiofsd: none is setuid.)
func dieWithTest() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }

func copyFile(dst, src string, perm os.FileMode) error {
	b, err := os.ReadFile(src)
	if err == nil {
		err = os.WriteFile(dst, b, perm)
	}
	if err != nil {
		return fmt.Errorf("vm: copy %s: %w", src, err)
	}
	return nil
}

type syncBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuilder) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuilder) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
