package vm

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kpproxy/kp/test/vm/internal/boot"
)

// rootModules are what the guest's init needs before the root exists: the
// cloud kernel builds virtio PCI and virtiofs as modules (and has no 9p at
// all), and overlayfs and virtio_console (the output's port) as modules too,
// so they travel in the initramfs.
var rootModules = []string{"virtio_pci", "virtiofs", "overlay", "virtio_console"}

// writeInitramfs writes a newc cpio archive holding the guest's init as
// /init and rootModules (with their dependencies) as /modules/NAME.ko, and
// returns the load order the init follows.
func writeInitramfs(out, initBin, modulesDir string, ix boot.Index) ([]string, error) {
	order, err := ix.Order(rootModules...)
	if err != nil {
		return nil, fmt.Errorf("initramfs: %w", err)
	}
	f, err := os.Create(out)
	if err != nil {
		return nil, fmt.Errorf("initramfs: %w", err)
	}
	defer f.Close()
	w := &cpioWriter{w: bufio.NewWriter(f)}
	w.dir("modules")
	if err := w.file("init", initBin, 0o755); err != nil {
		return nil, err
	}
	w.bytes("modules/order", []byte(strings.Join(order, "\n")+"\n"), 0o644)
	for _, m := range order {
		if err := w.file("modules/"+m+".ko", filepath.Join(modulesDir, ix[m].Path), 0o644); err != nil {
			return nil, err
		}
	}
	w.trailer()
	if w.err != nil {
		return nil, fmt.Errorf("initramfs %s: %w", out, w.err)
	}
	if err := w.w.Flush(); err != nil {
		return nil, fmt.Errorf("initramfs %s: %w", out, err)
	}
	return order, f.Close()
}

// cpioWriter writes the "newc" format the kernel unpacks an initramfs from
// (Documentation/driver-api/early-userspace/buffer-format.rst).
type cpioWriter struct {
	w   *bufio.Writer
	ino int
	err error
}

func (c *cpioWriter) header(name string, mode uint32, size int) {
	if c.err != nil {
		return
	}
	c.ino++
	// magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor,
	// devminor, rdevmajor, rdevminor, namesize, check.
	_, c.err = fmt.Fprintf(c.w, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, 1, 0, size, 0, 0, 0, 0, len(name)+1, 0)
	if c.err == nil {
		_, c.err = c.w.WriteString(name + "\x00")
	}
	c.pad(110 + len(name) + 1)
}

// pad aligns to 4 bytes after n bytes written.
func (c *cpioWriter) pad(n int) {
	if c.err == nil && n%4 != 0 {
		_, c.err = c.w.Write(make([]byte, 4-n%4))
	}
}

func (c *cpioWriter) dir(name string) { c.header(name, 0o040755, 0) }

func (c *cpioWriter) file(name, src string, perm uint32) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	c.bytes(name, b, perm)
	return nil
}

func (c *cpioWriter) bytes(name string, b []byte, perm uint32) {
	c.header(name, 0o100000|perm, len(b))
	if c.err == nil {
		_, c.err = c.w.Write(b)
	}
	c.pad(len(b))
}

func (c *cpioWriter) trailer() { c.header("TRAILER!!!", 0, 0) }
