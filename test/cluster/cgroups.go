package cluster

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cgroupMounts lists the mount points of every cgroup hierarchy: each v1
// controller's, named ones (name=systemd) and, on a hybrid host, the
// unified v2 one.
func cgroupMounts() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var mounts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		fields, typ := strings.Fields(pre), strings.Fields(post)
		if len(fields) < 5 || len(typ) < 1 || (typ[0] != "cgroup" && typ[0] != "cgroup2") {
			continue
		}
		if !slices.Contains(mounts, fields[4]) {
			mounts = append(mounts, fields[4])
		}
	}
	return mounts, sc.Err()
}

// makeCgroup creates the cgroup rel (/kpt-1-node3/system) in every
// hierarchy. A new cpuset cgroup has no CPUs and no memory nodes, and no
// process may join it until it has: copy them from the parent, level by
// level.
func makeCgroup(rel string) error {
	mounts, err := cgroupMounts()
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", rel, err)
	}
	for _, m := range mounts {
		dir := m
		for _, part := range strings.Split(strings.Trim(rel, "/"), "/") {
			parent := dir
			dir = filepath.Join(dir, part)
			if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("cgroup %s: %w", dir, err)
			}
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				cur, err := os.ReadFile(filepath.Join(dir, f))
				if err != nil || strings.TrimSpace(string(cur)) != "" {
					continue
				}
				v, err := os.ReadFile(filepath.Join(parent, f))
				if err != nil {
					return fmt.Errorf("cgroup %s: %w", dir, err)
				}
				if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
					return fmt.Errorf("cgroup %s: %s: %w", dir, f, err)
				}
			}
		}
	}
	return nil
}

// cgroupProcsFiles lists rel's cgroup.procs file in every hierarchy, for a
// shell that moves itself there before it execs a node's daemon.
func cgroupProcsFiles(rel string) ([]string, error) {
	mounts, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	files := make([]string, 0, len(mounts))
	for _, m := range mounts {
		files = append(files, filepath.Join(m, rel, "cgroup.procs"))
	}
	return files, nil
}

// cgroupPids lists the processes in rel or below it, in any hierarchy.
func cgroupPids(rel string) []int {
	mounts, _ := cgroupMounts()
	var pids []int
	for _, m := range mounts {
		_ = filepath.WalkDir(filepath.Join(m, rel), func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			if err != nil {
				return nil
			}
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() && !slices.Contains(pids, pid) {
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	return pids
}

// killCgroup kills every process in rel or below, again until none is
// left (a process may fork while its siblings die), and reports those
// still there after 20 s.
func killCgroup(rel string) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		pids := cgroupPids(rel)
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: processes %v survive SIGKILL", rel, pids)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// removeCgroup removes rel and every cgroup below it, deepest first, in
// every hierarchy. A cgroup whose last process just died may stay busy for
// a moment: retry for a few seconds.
func removeCgroup(rel string) error {
	mounts, err := cgroupMounts()
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range mounts {
		var dirs []string
		_ = filepath.WalkDir(filepath.Join(m, rel), func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		slices.SortFunc(dirs, func(a, b string) int { return len(b) - len(a) })
		for _, d := range dirs {
			var err error
			for i := 0; i < 50; i++ {
				if err = syscall.Rmdir(d); err == nil || errors.Is(err, syscall.ENOENT) {
					err = nil
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}
