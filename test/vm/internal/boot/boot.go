// Package boot is what the host side of the VM harness (test/vm) and the
// guest's init (test/vm/cmd/kp-vm-init) share: the run's configuration and
// the kernel's module index, both written by the host as JSON into the run's
// folder, which the guest sees at the same path through the shared root.
package boot

import (
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// ConfigFile is the configuration's name in the run's folder.
const ConfigFile = "vm.json"

// ExitMarker starts the line the guest's init prints on the console with the
// command's exit status; ReadyMarker the line it prints just before starting
// the command (the boot time ends there).
const (
	ExitMarker  = "KP-VM-EXIT "
	ReadyMarker = "KP-VM-READY"
)

// Config is one run: what to load, what to run, where its output goes.
type Config struct {
	// ModulesDir is the extracted kernel's lib/modules/<release>, a host
	// path the guest reads through the shared root.
	ModulesDir string `json:"modulesDir"`
	// Index describes every module of that kernel.
	Index Index `json:"index"`
	// Modules are loaded (with their dependencies) before the command runs.
	Modules []string `json:"modules"`
	// Overlays are folders of the read-only root made writable with a tmpfs
	// upper layer; Tmpfs are folders replaced by an empty tmpfs.
	Overlays []string `json:"overlays"`
	Tmpfs    []string `json:"tmpfs"`
	// Command, its environment and working folder.
	Command []string `json:"command"`
	Env     []string `json:"env"`
	Dir     string   `json:"dir"`
	// OutputPort names the virtio serial port the command's stdout and
	// stderr go to (the host writes it to a file).
	OutputPort string `json:"outputPort"`
}

// ReadConfig reads the configuration from a run's folder.
func ReadConfig(dir string) (*Config, error) {
	b, err := os.ReadFile(filepath.Join(dir, ConfigFile))
	if err != nil {
		return nil, fmt.Errorf("vm config: %w", err)
	}
	var c Config
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("vm config %s: %w", filepath.Join(dir, ConfigFile), err)
	}
	return &c, nil
}

// Write writes the configuration into a run's folder.
func (c *Config) Write(dir string) error {
	b, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("vm config: %w", err)
	}
	return os.WriteFile(filepath.Join(dir, ConfigFile), b, 0o644)
}

// Module is one loadable module of the kernel, or a built-in one (no Path).
type Module struct {
	// Path is relative to the modules folder (kernel/net/...ko).
	Path    string   `json:"path,omitempty"`
	Depends []string `json:"depends,omitempty"`
	Aliases []string `json:"aliases,omitempty"`
}

// Index maps a module's name (underscores, as the kernel names it) to it.
type Index map[string]Module

// Name normalises a module name as modprobe does: dashes and underscores
// are the same.
func Name(s string) string { return strings.ReplaceAll(s, "-", "_") }

// Resolve finds the module a name or an alias (what the kernel's
// request_module asks for, e.g. "nft-chain-2-nat" or "rtnl-link-dummy")
// stands for.
func (ix Index) Resolve(name string) (string, bool) {
	if _, ok := ix[Name(name)]; ok {
		return Name(name), true
	}
	for mod, m := range ix {
		for _, a := range m.Aliases {
			// Aliases are shell globs (modalias patterns); path.Match is
			// the same language for the names the kernel requests.
			if ok, _ := path.Match(a, name); ok {
				return mod, true
			}
		}
	}
	return "", false
}

// Order returns the modules to load for names, dependencies first, each
// once; built-in modules are left out. An unknown name is an error naming it.
func (ix Index) Order(names ...string) ([]string, error) {
	var order []string
	seen := map[string]bool{}
	var visit func(string, string) error
	visit = func(name, by string) error {
		mod, ok := ix.Resolve(name)
		if !ok {
			if by != "" {
				return fmt.Errorf("module %s (needed by %s): not in this kernel", name, by)
			}
			return fmt.Errorf("module %s: not in this kernel", name)
		}
		if seen[mod] {
			return nil
		}
		seen[mod] = true
		for _, d := range ix[mod].Depends {
			if err := visit(d, mod); err != nil {
				return err
			}
		}
		if ix[mod].Path != "" {
			order = append(order, mod)
		}
		return nil
	}
	for _, n := range names {
		if err := visit(n, ""); err != nil {
			return nil, err
		}
	}
	return order, nil
}
