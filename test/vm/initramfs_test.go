package vm

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kpproxy/kp/test/vm/internal/boot"
)

// readNewc reads a newc cpio archive back into name → content (folders as
// "/"), in order, as the kernel's unpacker walks it.
func readNewc(t *testing.T, b []byte) ([]string, map[string]string) {
	t.Helper()
	var names []string
	files := map[string]string{}
	align := func(n int) int { return (n + 3) &^ 3 }
	for off := 0; ; {
		if len(b) < off+110 || string(b[off:off+6]) != "070701" {
			t.Fatalf("no newc header at offset %d", off)
		}
		field := func(i int) int {
			v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
			if err != nil {
				t.Fatalf("header at %d, field %d: %v", off, i, err)
			}
			return int(v)
		}
		mode, size, namesize := field(1), field(6), field(11)
		name := string(b[off+110 : off+110+namesize-1])
		data := align(off + 110 + namesize)
		if name == "TRAILER!!!" {
			return names, files
		}
		names = append(names, name)
		if mode&0o040000 != 0 {
			files[name] = "/"
		} else {
			files[name] = string(b[data : data+size])
		}
		off = align(data + size)
	}
}

func TestInitramfsHoldsInitAndTheRootModulesInLoadOrder(t *testing.T) {
	dir := t.TempDir()
	mods := filepath.Join(dir, "modules")
	ix := boot.Index{}
	for name, deps := range map[string][]string{
		"virtio": nil, "virtio_ring": nil, "virtio_pci": {"virtio", "virtio_ring"},
		"fuse": nil, "virtiofs": {"fuse", "virtio", "virtio_ring"}, "overlay": nil, "virtio_console": {"virtio", "virtio_ring"}, "ip_vs": nil,
	} {
		path := filepath.Join("kernel", name+".ko")
		if err := os.MkdirAll(filepath.Join(mods, "kernel"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(mods, path), []byte("ko:"+name), 0o644); err != nil {
			t.Fatal(err)
		}
		ix[name] = boot.Module{Path: path, Depends: deps}
	}
	initBin := filepath.Join(dir, "init")
	if err := os.WriteFile(initBin, []byte("odd-sized init\x00"), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "initrd.cpio")
	order, err := writeInitramfs(out, initBin, mods, ix)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	names, files := readNewc(t, b)
	if names[0] != "modules" || files["init"] != "odd-sized init\x00" {
		t.Errorf("archive starts %v with init %q, want the modules folder and the init binary", names, files["init"])
	}
	wantOrder := []string{"virtio", "virtio_ring", "virtio_pci", "fuse", "virtiofs", "overlay", "virtio_console"}
	if !reflect.DeepEqual(order, wantOrder) {
		t.Errorf("load order %v, want %v", order, wantOrder)
	}
	if got := files["modules/order"]; got != "virtio\nvirtio_ring\nvirtio_pci\nfuse\nvirtiofs\noverlay\nvirtio_console\n" {
		t.Errorf("modules/order = %q", got)
	}
	for _, m := range wantOrder {
		if files["modules/"+m+".ko"] != "ko:"+m {
			t.Errorf("modules/%s.ko = %q", m, files["modules/"+m+".ko"])
		}
	}
	if _, ok := files["modules/ip_vs.ko"]; ok {
		t.Errorf("ip_vs is in the initramfs; only what mounting the root needs belongs there")
	}
}

// TestQemuNeverUsesKVMOrANetwork guards the two rules of this machine:
// -enable-kvm hangs it, and nothing may leave the VM.
func TestQemuNeverUsesKVMOrANetwork(t *testing.T) {
	opts := Options{}
	opts.defaults()
	args := strings.Join(qemuArgs(opts, &Kernel{Image: "vmlinuz"}, "/tmp/d", "initrd", "sock", "out"), " ")
	for _, want := range []string{"accel=tcg", "-nic none", "-smp 2", "-m 2048", "-no-reboot"} {
		if !strings.Contains(args, want) {
			t.Errorf("qemu arguments lack %q: %s", want, args)
		}
	}
	for _, bad := range []string{"kvm", "-netdev", "-net ", "virtio-net", "e1000"} {
		if strings.Contains(args, bad) {
			t.Errorf("qemu arguments hold %q: %s", bad, args)
		}
	}
}

// TestBootSkipsTheCryptoSelfTests: the guest kernel is told to skip its
// crypto self-tests, which once took a loaded machine's whole boot
// deadline under emulation.
func TestBootSkipsTheCryptoSelfTests(t *testing.T) {
	opts := Options{}
	opts.defaults()
	args := qemuArgs(opts, &Kernel{Image: "vmlinuz"}, "/tmp/d", "initrd", "sock", "out")
	i := slices.Index(args, "-append")
	if i < 0 || !slices.Contains(strings.Fields(args[i+1]), "cryptomgr.notests") {
		t.Errorf("the kernel's command line lacks cryptomgr.notests: %v", args)
	}
}
