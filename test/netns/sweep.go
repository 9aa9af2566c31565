package netns

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

var sweepOnce sync.Once

const netnsDir = "/run/netns"

// SweepStale deletes what a killed test run left behind: namespaces named
// with Prefix, and folders of built binaries, whose test process is gone (or
// whose pid now belongs to a process younger than them). What belongs to
// test processes still running, such as another package's tests in
// parallel, is left alone.
func SweepStale() []error {
	var errs []error
	for _, name := range staleEntries(netnsDir, Prefix) {
		if err := deleteNS(name); err != nil {
			errs = append(errs, err)
		}
	}
	for _, name := range staleEntries(os.TempDir(), binDirPrefix) {
		if err := os.RemoveAll(filepath.Join(os.TempDir(), name)); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// Stale lists the entries of dir named prefix+PID-… whose PID is not a
// test process that was running when the entry was made: what a killed run
// left. Other harnesses (test/cluster) sweep their own leftovers with it.
func Stale(dir, prefix string) []string { return staleEntries(dir, prefix) }

// staleEntries lists the entries of dir named prefix+PID-… whose PID is not
// a process that was running when the entry was made.
func staleEntries(dir, prefix string) []string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var stale []string
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok {
			continue
		}
		pidStr, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil {
			continue
		}
		info, err := e.Info()
		if err != nil || alive(pid, info.ModTime()) {
			continue
		}
		stale = append(stale, e.Name())
	}
	return stale
}

// alive reports whether pid is a process that started before created. A
// killed test process nobody reaped yet (a zombie) is not alive.
func alive(pid int, created time.Time) bool {
	if pid == os.Getpid() {
		return true
	}
	started, err := processStart(pid)
	if err != nil {
		return false // gone or a zombie
	}
	return !started.After(created.Add(time.Second))
}

func processStart(pid int) (time.Time, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return time.Time{}, err
	}
	// Fields after the command name, which is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(stat), ')')
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 20 {
		return time.Time{}, fmt.Errorf("short /proc/%d/stat", pid)
	}
	if f[0] == "Z" || f[0] == "X" {
		return time.Time{}, fmt.Errorf("process %d is dead (state %s)", pid, f[0])
	}
	ticks, err := strconv.ParseInt(f[19], 10, 64) // field 22: starttime
	if err != nil {
		return time.Time{}, err
	}
	btime, err := bootTime()
	if err != nil {
		return time.Time{}, err
	}
	const hz = 100 // USER_HZ is 100 on every Linux ABI Go supports
	return btime.Add(time.Duration(ticks) * time.Second / hz), nil
}

func bootTime() (time.Time, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "btime "); ok {
			s, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return time.Unix(s, 0), err
		}
	}
	return time.Time{}, fmt.Errorf("no btime in /proc/stat")
}

// deleteNS kills every process left in namespace name and deletes it.
// A namespace that is already gone is not an error.
func deleteNS(name string) error {
	if _, err := os.Stat(filepath.Join(netnsDir, name)); os.IsNotExist(err) {
		return nil
	}
	if out, err := exec.Command("ip", "netns", "pids", name).Output(); err == nil {
		for _, f := range strings.Fields(string(out)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	return ip("netns", "del", name)
}
