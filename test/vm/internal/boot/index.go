package boot

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// ReadIndex builds the index of a kernel's modules folder from each
// module's .modinfo section and modules.builtin. Debian ships no
// modules.dep (depmod writes it at install, and kp never installs the
// kernel), and the host has no kmod, so the dependencies come from the
// modules themselves.
func ReadIndex(modulesDir string) (Index, error) {
	ix := Index{}
	err := filepath.WalkDir(filepath.Join(modulesDir, "kernel"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".ko") {
			return err
		}
		rel, err := filepath.Rel(modulesDir, p)
		if err != nil {
			return err
		}
		name, m, err := readModinfo(p)
		if err != nil {
			return err
		}
		m.Path = rel
		ix[name] = m
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("module index of %s: %w", modulesDir, err)
	}
	if f, err := os.Open(filepath.Join(modulesDir, "modules.builtin")); err == nil {
		defer f.Close()
		s := bufio.NewScanner(f)
		for s.Scan() {
			name := Name(strings.TrimSuffix(filepath.Base(s.Text()), ".ko"))
			if _, ok := ix[name]; !ok {
				ix[name] = Module{}
			}
		}
	}
	return ix, nil
}

func readModinfo(p string) (string, Module, error) {
	f, err := elf.Open(p)
	if err != nil {
		return "", Module{}, fmt.Errorf("module %s: %w", p, err)
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return "", Module{}, fmt.Errorf("module %s: no .modinfo section", p)
	}
	data, err := sec.Data()
	if err != nil {
		return "", Module{}, fmt.Errorf("module %s: .modinfo: %w", p, err)
	}
	name := Name(strings.TrimSuffix(filepath.Base(p), ".ko"))
	var m Module
	for _, kv := range bytes.Split(data, []byte{0}) {
		k, v, ok := strings.Cut(string(kv), "=")
		if !ok {
			continue
		}
		switch k {
		case "name":
			name = Name(v)
		case "depends":
			for _, d := range strings.Split(v, ",") {
				if d != "" {
					m.Depends = append(m.Depends, Name(d))
				}
			}
		case "alias":
			m.Aliases = append(m.Aliases, v)
		}
	}
	return name, m, nil
}
