package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// kubeletSysctls are the kernel settings the kubelet writes at start
// (unless protectKernelDefaults, which would make it refuse to start on
// this host instead): global, not per namespace, so the harness saves them
// before the first kubelet and restores them after the last.
var kubeletSysctls = []string{
	"vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic", "kernel.panic_on_oops",
	"kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes",
}

// saved is the process's record of the settings, shared by its clusters.
var saved struct {
	mu     sync.Mutex
	users  int
	values map[string]string
	file   string // the same values on disk, for SweepStale after a crash
}

// lastRestore is what the last restore wrote and the record it came from
// (this process's, or a killed run's for SweepStale): the tests check it,
// keyed to their own record, because the live settings are rewritten by any
// other test process's kubelets (go test -p runs test/cluster beside
// test/nodes), which would switch a check of the live values off.
var lastRestore struct {
	mu     sync.Mutex
	values map[string]string
	file   string
}

func recordRestore(file string, values map[string]string) {
	lastRestore.mu.Lock()
	defer lastRestore.mu.Unlock()
	lastRestore.values, lastRestore.file = values, file
}

// restoredFrom returns what the last restore wrote, if it came from file.
func restoredFrom(file string) (map[string]string, bool) {
	lastRestore.mu.Lock()
	defer lastRestore.mu.Unlock()
	return lastRestore.values, lastRestore.file == file && file != ""
}

// sysctlsFile is the record of the settings test process pid saved.
func sysctlsFile(pid int) string {
	return filepath.Join(stateRoot, fmt.Sprintf("%s%d-sysctls.json", prefix, pid))
}

func sysctlPath(key string) string {
	return filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
}

// saveSysctls records the settings (once for all clusters of the process)
// and returns the function that restores them when the last user is done.
func saveSysctls() (restore func() error, err error) {
	saved.mu.Lock()
	defer saved.mu.Unlock()
	if saved.users == 0 {
		// Another test process running clusters (go test -p runs packages
		// in parallel) may have kubelets running that already rewrote the
		// settings: its record holds the machine's own values.
		values := otherProcessSysctls()
		if values == nil {
			values = map[string]string{}
			for _, k := range kubeletSysctls {
				b, err := os.ReadFile(sysctlPath(k))
				if err != nil {
					return nil, fmt.Errorf("save sysctl %s: %w", k, err)
				}
				values[k] = strings.TrimSpace(string(b))
			}
		}
		b, _ := json.Marshal(values)
		file := sysctlsFile(os.Getpid())
		if err := os.MkdirAll(stateRoot, 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(file, b, 0o644); err != nil {
			return nil, err
		}
		saved.values, saved.file = values, file
	}
	saved.users++
	var once sync.Once
	return func() error {
		var err error
		once.Do(func() {
			saved.mu.Lock()
			defer saved.mu.Unlock()
			saved.users--
			if saved.users > 0 {
				return
			}
			err = writeSysctls(saved.values)
			if err == nil {
				recordRestore(saved.file, saved.values)
				os.Remove(saved.file)
			}
			if otherProcessSysctls() == nil {
				removeSharedDirs()
			}
		})
		return err
	}, nil
}

// otherProcessSysctls returns the settings another live test process
// saved, or nil. (Stale records were restored and removed by SweepStale
// before.)
func otherProcessSysctls() map[string]string {
	files, _ := filepath.Glob(filepath.Join(stateRoot, prefix+"*-sysctls.json"))
	mine := fmt.Sprintf("%s%d-", prefix, os.Getpid())
	for _, f := range files {
		if strings.HasPrefix(filepath.Base(f), mine) {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var values map[string]string
		if json.Unmarshal(b, &values) == nil && len(values) == len(kubeletSysctls) {
			return values
		}
	}
	return nil
}

func writeSysctls(values map[string]string) error {
	var errs []error
	for k, v := range values {
		if err := os.WriteFile(sysctlPath(k), []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore sysctl %s=%s: %w", k, v, err))
		}
	}
	return errors.Join(errs...)
}

// restoreSysctlsFile restores the settings a killed run saved in file.
func restoreSysctlsFile(file string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var values map[string]string
	if err := json.Unmarshal(b, &values); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	if err := writeSysctls(values); err != nil {
		return err
	}
	recordRestore(file, values)
	return os.Remove(file)
}
