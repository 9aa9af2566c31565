package cluster

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

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
	saved.mu.Lock()
	idle := saved.users == 0
	saved.mu.Unlock()
	if len(stale) > 0 && idle && otherProcessSysctls() == nil {
		removeSharedDirs()
	}
	return errs
}

// removeNodeLeftovers removes what node namespace ns made outside it:
// kills every process in its cgroups (containerd's shims and the
// containers outlive the kubelet and containerd), unmounts and removes its
// folder, removes its cgroups, the shims' sockets and the CNI results
// libcni cached in /var/lib/cni/results.
func removeNodeLeftovers(ns string) error {
	rel := "/" + ns
	dir := filepath.Join(stateRoot, ns)
	// While the shims live, their sockets show in the node's namespace
	// (if it is still there: a sweep comes before netns's own).
	var socks []string
	if _, err := os.Stat(filepath.Join("/run/netns", ns)); err == nil {
		socks = shimSockets(ns)
	}
	cached, _ := filepath.Glob(filepath.Join(cniResults, ns+"-*"))
	if entries, err := os.ReadDir(filepath.Join(dir, "containerd", "state", "io.containerd.grpc.v1.cri", "sandboxes")); err == nil {
		for _, e := range entries {
			cached = append(cached, filepath.Join(cniResults, "cni-loopback-"+e.Name()+"-lo"))
		}
	}
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
	// The kubelet links every container's log into /var/log/containers
	// (a path it does not let one change).
	if links, err := os.ReadDir(containerLogLinks); err == nil {
		for _, l := range links {
			p := filepath.Join(containerLogLinks, l.Name())
			if target, err := os.Readlink(p); err == nil && strings.HasPrefix(target, dir+"/") {
				cached = append(cached, p)
			}
		}
	}
	for _, f := range append(socks, cached...) {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// containerLogLinks is where kubelets link their containers' logs.
const containerLogLinks = "/var/log/containers"

// sharedDirs are what the kubelet, containerd's shims and libcni make at
// fixed paths, whatever their configuration (the kubelets of all nodes
// share the device plugin socket); children first. They are removed (the
// folders when empty) after the last cluster on the machine is gone.
var sharedDirs = []string{
	"/run/containerd/s", "/run/containerd",
	"/var/lib/kubelet/device-plugins/kubelet.sock", "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint",
	"/var/lib/kubelet/device-plugins", "/var/lib/kubelet",
	cniResults, "/var/lib/cni",
	containerLogLinks,
	stateRoot,
}

// removeSharedDirs removes the sharedDirs: folders only when empty, so
// one still in use (a system containerd's) stays. The shims' socket folder
// loses its dead sockets first: a killed run's shims are found through
// their node's namespace, and another test process may have swept that
// namespace before this sweep came.
func removeSharedDirs() {
	removeDeadSockets(shimSocketDir)
	for _, d := range sharedDirs {
		_ = os.Remove(d)
	}
}

// shimSocketDir is where containerd's shims put their sockets, whatever
// containerd's configuration.
const shimSocketDir = "/run/containerd/s"

// removeDeadSockets removes the Unix sockets in dir that nothing listens
// on any more (a connection is refused); a live one, a system
// containerd's shims' say, stays.
func removeDeadSockets(dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if e.Type()&fs.ModeSocket == 0 {
			continue
		}
		p := filepath.Join(dir, e.Name())
		c, err := net.DialTimeout("unix", p, time.Second)
		if err == nil {
			c.Close()
			continue
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			_ = os.Remove(p)
		}
	}
}

// cniResults is where libcni caches each attachment's result: containerd
// 1.6 does not move it.
const cniResults = "/var/lib/cni/results"
