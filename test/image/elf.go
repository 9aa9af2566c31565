package image

import (
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"path"
)

// multiarch is the GNU triplet Debian names each architecture's library
// directories after.
var multiarch = map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}

// libDirs are where the dynamic loader of the Debian architecture arch
// looks for a library with no path, in its order: Debian's glibc has the
// multiarch directories built in, so the image needs no /etc/ld.so.cache.
func libDirs(arch string) ([]string, error) {
	triplet, ok := multiarch[arch]
	if !ok {
		return nil, fmt.Errorf("architecture %q: kp's images are built for amd64 and arm64", arch)
	}
	return []string{"/lib/" + triplet, "/usr/lib/" + triplet, "/lib64", "/usr/lib64", "/lib", "/usr/lib"}, nil
}

// elfDeps returns what the ELF file at host needs to start: its program
// interpreter (the dynamic loader) and the libraries its dynamic section
// names (DT_NEEDED). A static binary needs nothing; a file that is not ELF
// reports ok false.
func elfDeps(host string) (interp string, needed []string, ok bool, err error) {
	if !isELF(host) {
		return "", nil, false, nil
	}
	f, err := elf.Open(host)
	if err != nil {
		return "", nil, true, err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b, err := io.ReadAll(p.Open())
		if err != nil {
			return "", nil, true, fmt.Errorf("%s: program interpreter: %w", host, err)
		}
		interp = string(bytes.TrimRight(b, "\x00"))
	}
	if needed, err = f.DynString(elf.DT_NEEDED); err != nil {
		return "", nil, true, fmt.Errorf("%s: DT_NEEDED: %w", host, err)
	}
	return interp, needed, true, nil
}

// elfMachines are the ELF machines of the Debian architectures.
var elfMachines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// elfFor checks that the ELF file at host is built for the Debian
// architecture arch: a kp of the wrong architecture in an image would
// fail only on the node, with "exec format error".
func elfFor(host, arch string) error {
	f, err := elf.Open(host)
	if err != nil {
		return err
	}
	defer f.Close()
	if want, ok := elfMachines[arch]; !ok || f.Machine != want {
		return fmt.Errorf("%s is built for %v, the image is %s", host, f.Machine, arch)
	}
	return nil
}

// isELF reports whether the file at host starts with the ELF magic number.
func isELF(host string) bool {
	f, err := os.Open(host)
	if err != nil {
		return false
	}
	defer f.Close()
	magic := make([]byte, 4)
	_, err = io.ReadFull(f, magic)
	return err == nil && string(magic) == elf.ELFMAG
}

// libraryClosure returns the paths (libraries and the links that name them)
// that the ELF files among roots need, directly or through each other,
// looked up in t. roots maps an image path to its file on the host; the
// result leaves roots out. A library found nowhere is an error naming who
// needs it: an image without it would not start.
func libraryClosure(t *debTree, roots map[string]string) ([]string, error) {
	dirs, err := libDirs(t.arch)
	if err != nil {
		return nil, err
	}
	var (
		out   []string
		seen  = map[string]bool{}
		queue []string
		hosts = map[string]string{}
	)
	add := func(p string) error {
		target, links, err := t.resolve(p)
		if err != nil {
			return err
		}
		for _, q := range append(links, target) {
			if !seen[q] {
				seen[q] = true
				out = append(out, q)
			}
		}
		if _, queued := hosts[target]; !queued {
			hosts[target] = t.files[target].host
			queue = append(queue, target)
		}
		return nil
	}
	for p, host := range roots {
		seen[p] = true
		hosts[p] = host
		queue = append(queue, p)
	}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		interp, needed, ok, err := elfDeps(hosts[p])
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		if interp != "" {
			if err := add(interp); err != nil {
				return nil, fmt.Errorf("%s: dynamic loader: %w", p, err)
			}
		}
		for _, lib := range needed {
			found := false
			for _, dir := range dirs {
				if _, ok := t.files[path.Join(dir, lib)]; ok {
					if err := add(path.Join(dir, lib)); err != nil {
						return nil, fmt.Errorf("%s needs %s: %w", p, lib, err)
					}
					found = true
					break
				}
			}
			if !found {
				return nil, fmt.Errorf("%s needs %s: in none of %v of the packages (add the package that has it)", p, lib, dirs)
			}
		}
	}
	return out, nil
}
