// Command kp-vm-init is the VM harness's guest side (see test/vm). As PID 1
// of the initramfs it loads the modules virtiofs needs, mounts the host's
// root (read-only, shared by virtiofsd) with tmpfs overlays for what must be
// writable, switches into it, loads the modules the run asks for, runs the
// command with its output on a virtio serial port, prints the exit status
// on the console and powers off. The kernel also runs it as its modprobe
// (kernel.modprobe points at it): the host has no kmod, and the kernel's own
// module requests (rtnl-link-dummy, nft-chain-2-nat, ip_vs_rr...) must work.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kpproxy/kp/test/vm/internal/boot"
)

func main() {
	if os.Getpid() != 1 {
		os.Exit(modprobe(os.Args[1:]))
	}
	// The kernel starts init with an empty environment.
	os.Setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	code := 1
	if err := run(&code); err != nil {
		fmt.Fprintf(os.Stderr, "kp-vm-init: %v\n", err)
	}
	fmt.Printf("\n%s%d\n", boot.ExitMarker, code)
	unix.Sync()
	// The host runs qemu with -no-reboot, so a restart ends it too; power
	// off is the clean way.
	unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
	select {}
}

func run(code *int) error {
	for _, m := range []struct{ src, dst, typ string }{
		{"devtmpfs", "/dev", "devtmpfs"}, {"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"},
	} {
		os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.typ, 0, ""); err != nil {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	// The initramfs' modules come in the order the host listed them:
	// dependencies first.
	mods, _ := filepath.Glob("/modules/*.ko")
	order, err := os.ReadFile("/modules/order")
	if err != nil {
		return fmt.Errorf("initramfs: %w (modules: %v)", err, mods)
	}
	for _, m := range strings.Fields(string(order)) {
		if err := insmod("/modules/"+m+".ko", ""); err != nil {
			return err
		}
	}
	up("initramfs modules loaded")
	dir := cmdline("kp.dir")
	if dir == "" {
		return errors.New("no kp.dir= on the kernel command line")
	}
	if err := mountRoot(dir); err != nil {
		return err
	}
	up("root mounted")
	cfg, err := boot.ReadConfig(dir)
	if err != nil {
		return err
	}
	if err := setup(dir, cfg); err != nil {
		return err
	}
	out, err := openPort(cfg.OutputPort)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd := exec.Command(cfg.Command[0], cfg.Command[1:]...)
	cmd.Env, cmd.Dir, cmd.Stdout, cmd.Stderr = cfg.Env, cfg.Dir, out, out
	up("starting the command")
	fmt.Println(boot.ReadyMarker)
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		*code = exit.ExitCode()
	case err != nil:
		fmt.Fprintf(out, "kp-vm-init: %v\n", err)
		*code = 127
	default:
		*code = 0
	}
	return nil
}

// mountRoot mounts the host's root, shared with the tag "root", read-only
// on /newroot, lays the writable folders over it and makes it the root.
func mountRoot(dir string) error {
	if err := os.MkdirAll("/newroot", 0o755); err != nil {
		return err
	}
	if err := unix.Mount("root", "/newroot", "virtiofs", unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("mount the host's root (virtiofs tag root): %w", err)
	}
	cfg, err := boot.ReadConfig("/newroot" + dir)
	if err != nil {
		return err
	}
	// The upper layers live on one tmpfs outside the new root; the overlays
	// keep it alive after the switch.
	os.MkdirAll("/upper", 0o755)
	if err := unix.Mount("tmpfs", "/upper", "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("mount /upper: %w", err)
	}
	for _, d := range cfg.Overlays {
		up, work := filepath.Join("/upper", d, "u"), filepath.Join("/upper", d, "w")
		os.MkdirAll(up, 0o755)
		os.MkdirAll(work, 0o755)
		opts := fmt.Sprintf("lowerdir=/newroot%s,upperdir=%s,workdir=%s", d, up, work)
		if err := unix.Mount("overlay", "/newroot"+d, "overlay", 0, opts); err != nil {
			return fmt.Errorf("overlay on %s: %w", d, err)
		}
	}
	for _, d := range cfg.Tmpfs {
		if err := unix.Mount("tmpfs", "/newroot"+d, "tmpfs", 0, "mode=0755"); err != nil {
			return fmt.Errorf("tmpfs on %s: %w", d, err)
		}
	}
	for _, d := range []string{"/dev", "/proc", "/sys"} {
		if err := unix.Mount(d, "/newroot"+d, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move %s into the new root: %w", d, err)
		}
	}
	// switch_root without deleting the initramfs: it is a few MB of RAM.
	if err := unix.Chdir("/newroot"); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move the new root to /: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	return unix.Chdir("/")
}

// setup prepares the new root: kernel.modprobe, the run's modules, the
// usual mounts tools expect, lo and a hostname.
func setup(dir string, cfg *boot.Config) error {
	self := filepath.Join(dir, "init")
	if err := os.WriteFile("/proc/sys/kernel/modprobe", []byte(self), 0o644); err != nil {
		return fmt.Errorf("kernel.modprobe: %w", err)
	}
	order, err := cfg.Index.Order(cfg.Modules...)
	if err != nil {
		return err
	}
	for _, m := range order {
		if err := insmod(filepath.Join(cfg.ModulesDir, cfg.Index[m].Path), params[m]); err != nil {
			return err
		}
	}
	up(fmt.Sprintf("%d modules loaded", len(order)))
	for _, m := range []struct{ src, dst, typ, opts string }{
		{"devpts", "/dev/pts", "devpts", "ptmxmode=0666"},
		{"tmpfs", "/dev/shm", "tmpfs", ""},
		{"cgroup2", "/sys/fs/cgroup", "cgroup2", ""},
		{"bpf", "/sys/fs/bpf", "bpf", ""},
	} {
		os.MkdirAll(m.dst, 0o755)
		unix.Mount(m.src, m.dst, m.typ, 0, m.opts) // best effort: not every test needs them
	}
	unix.Sethostname([]byte("kp-vm"))
	return loUp()
}

// modprobe serves the kernel's request_module: argv is "-q -- NAME".
func modprobe(args []string) int {
	var name string
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			name = a
		}
	}
	cfg, err := boot.ReadConfig(filepath.Dir(os.Args[0]))
	if err != nil || name == "" {
		return 1
	}
	order, err := cfg.Index.Order(name)
	if err != nil {
		return 1
	}
	for _, m := range order {
		if err := insmod(filepath.Join(cfg.ModulesDir, cfg.Index[m].Path), params[m]); err != nil {
			fmt.Fprintf(os.Stderr, "modprobe %s: %v\n", name, err)
			return 1
		}
	}
	return 0
}

// openPort opens the virtio serial port named name: without udev there is
// no /dev/virtio-ports/NAME link, so it is found by its name in sysfs.
func openPort(name string) (*os.File, error) {
	ports, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
	for _, p := range ports {
		if b, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(b)) == name {
			dev := "/dev/" + filepath.Base(filepath.Dir(p))
			f, err := os.OpenFile(dev, os.O_WRONLY, 0)
			if err != nil {
				return nil, fmt.Errorf("command output port %s: %w", name, err)
			}
			return f, nil
		}
	}
	return nil, fmt.Errorf("command output: no virtio serial port named %s (ports: %v)", name, ports)
}

// params are module parameters kp's tests need.
var params = map[string]string{
	// Without it the dummy driver creates dummy0 on load; tests create the
	// interfaces they want.
	"dummy": "numdummies=0",
}

func insmod(path, params string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("insmod: %w", err)
	}
	defer f.Close()
	// EEXIST: loaded already (by an earlier request, or concurrently by the
	// kernel's own modprobe call).
	if err := unix.FinitModule(int(f.Fd()), params, 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("insmod %s: %w", path, err)
	}
	return nil
}

func cmdline(key string) string {
	b, _ := os.ReadFile("/proc/cmdline")
	for _, f := range strings.Fields(string(b)) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v
		}
	}
	return ""
}

// up prints a step of the boot with the guest's uptime on the console, which
// the host shows when the boot fails; it says where a slow boot spends.
func up(step string) {
	b, _ := os.ReadFile("/proc/uptime")
	uptime, _, _ := strings.Cut(string(b), " ")
	fmt.Printf("kp-vm-init: %s at %ss\n", step, uptime)
}

// loUp brings the root namespace's lo up with an ioctl: exec'ing ip costs a
// second of emulated CPU at boot.
func loUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo up: get flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo up: set flags: %w", err)
	}
	return nil
}
