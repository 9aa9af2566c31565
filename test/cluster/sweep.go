package cluster

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/kpproxy/kp/test/netns"
)

// stateRoot holds each node's folder (kubelet, containerd and CNI state)
// and the saved kernel settings, named prefix+PID-…, so a run killed before
// its cleanups is swept by the next.
const stateRoot = "/var/lib/kp-test"

// prefix is netns.Prefix: a node's folder and cgroup are named after its
// namespace.
const prefix = netns.Prefix

var sweepOnce sync.Once

// SweepStale removes what a killed test run's clusters left: the processes
// in their nodes' cgroups (containers and shims outlive the kubelet and
// containerd, which die with the test process), the mounts under their
// folders, the folders, the cgroups, and it restores the kernel settings
// the run saved. Namespaces are netns.SweepStale's. Start calls it once per
// process.
func SweepStale() []error {
	var errs []error
	mounts, err := cgroupMounts()
	if err != nil {
		errs = append(errs, err)
	}
	stale := map[string]bool{}
	for _, name := range netns.Stale(stateRoot, prefix) {
		stale[name] = true
	}
	for _, m := range mounts {
		for _, name := range netns.Stale(m, prefix) {
			stale[name] = true
		}
	}
	for name := range stale {
		if strings.HasSuffix(name, "-sysctls.json") {
			if err := restoreSysctlsFile(filepath.Join(stateRoot, name)); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if err := removeNodeLeftovers(name); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// removeNodeLeftovers kills the processes of node ns's cgroup, unmounts
// and removes its folder and removes its cgroups.
func removeNodeLeftovers(ns string) error {
	rel := "/" + ns
	dir := filepath.Join(stateRoot, ns)
	var errs []error
	if err := killCgroup(rel); err != nil {
		errs = append(errs, err)
	}
	if _, err := os.Stat(dir); err == nil {
		if err := unmountUnder(dir); err != nil {
			errs = append(errs, err)
		} else if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
		}
	}
	if err := removeCgroup(rel); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
