package cluster

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	vnetns "github.com/vishvananda/netns"

	"github.com/kpproxy/kp/internal/nsenter"
	"github.com/kpproxy/kp/test/netns"
)

// Node is one node: a network namespace on the API server's bridge running
// containerd and a kubelet, its pods behind a bridge (cbr0) in it.
type Node struct {
	Name    string       // the Node object's name (and label kubernetes.io/hostname): node-1, node-2, …
	NS      string       // its network namespace (kpt-PID-nodeK)
	IP      netip.Addr   // its InternalIP, on the API server's bridge
	PodCIDR netip.Prefix // its pods' addresses (the bridge CNI's range)
	// Dir holds the kubelet's root dir (kubelet/), pod logs (pod-logs/),
	// containerd's root, state and socket (containerd/, containerd.sock),
	// runc's root (runc/), the CNI configuration and IPAM state (cni/).
	Dir        string
	Containerd *netns.Process
	Kubelet    *netns.Process

	c *Cluster
}

// Socket is the containerd socket: ctr --address Socket --namespace k8s.io.
func (n *Node) Socket() string { return filepath.Join(n.Dir, "containerd.sock") }

// CgroupRoot is the kubelet's cgroupRoot: every process of the node
// (daemons in CgroupRoot/system, pods in CgroupRoot/kubepods) lives under
// it, in every hierarchy.
func (n *Node) CgroupRoot() string { return "/" + n.NS }

// stateDir is containerd's CRI state, where it mounts the pods' network
// namespaces (netns_mounts_under_state_dir) and keeps its sandboxes.
func (n *Node) criStateDir() string {
	return filepath.Join(n.Dir, "containerd", "state", "io.containerd.grpc.v1.cri")
}

// prepare makes the node's namespace, network, folders and cgroups, and
// registers their removal; nothing runs yet.
func (n *Node) prepare() {
	t := n.c.t
	t.Helper()
	n.NS = netns.NewNamespace(t, "node")
	n.Dir = filepath.Join(stateRoot, n.NS)
	// Registered before any process starts, so it runs after the
	// processes' own cleanups (last in, first out) have stopped the kubelet
	// and containerd, and before the namespace goes.
	t.Cleanup(func() {
		if err := n.destroy(); err != nil {
			t.Errorf("clean up %s (%s): %v", n.Name, n.NS, err)
		}
	})
	n.IP = n.c.API.Connect(n.NS, n.PodCIDR)
	// The default route leads to the API server's namespace, which does not
	// forward: traffic to an address no rule claims dies there, after the
	// node's hooks saw it, and never leaves the test's namespaces.
	if err := netns.IP("-n", n.NS, "route", "add", "default", "via", n.c.API.Addr().String()); err != nil {
		t.Fatalf("node %s: %v", n.Name, err)
	}
	// Pods are bridged: their traffic reaches netfilter (kp's rules) only
	// with bridge-nf-call-iptables, as every bridge CNI requires.
	if out, err := netns.Exec(n.NS, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward && "+
		"echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables && "+
		"echo 1 > /proc/sys/net/bridge/bridge-nf-call-ip6tables"); err != nil {
		t.Fatalf("node %s: sysctls: %v %s", n.Name, err, out)
	}
	for _, d := range []string{"containerd/root", "containerd/state", "containerd/opt", "runc", "cni/net.d",
		"cni/ipam", "kubelet", "pod-logs", "volume-plugins"} {
		if err := os.MkdirAll(filepath.Join(n.Dir, d), 0o755); err != nil {
			t.Fatalf("node %s: %v", n.Name, err)
		}
	}
	if err := makeCgroup(n.CgroupRoot() + "/system"); err != nil {
		t.Fatalf("node %s: %v", n.Name, err)
	}
}

// inCgroup wraps a daemon's command line in a shell that moves itself into
// the node's system cgroup (every hierarchy) and then execs the daemon, so
// the daemon and everything it ever starts (containerd's shims, which
// detach from it) are found there at cleanup.
func (n *Node) inCgroup(path string, args ...string) (string, []string) {
	files, err := cgroupProcsFiles(n.CgroupRoot() + "/system")
	if err != nil {
		n.c.t.Fatalf("node %s: %v", n.Name, err)
	}
	script := fmt.Sprintf(`for f in %s; do echo $$ > "$f" 2>/dev/null; done; exec "$@"`, strings.Join(files, " "))
	if dir := n.c.iptablesDir; dir != "" {
		script = fmt.Sprintf(`PATH=%s:$PATH; export PATH; %s`, dir, script)
	}
	return "/bin/sh", append([]string{"-c", script, filepath.Base(path), path}, args...)
}

// startContainerd writes containerd's and the CNI's configuration, starts
// containerd and waits until it answers.
func (n *Node) startContainerd() {
	t := n.c.t
	t.Helper()
	// One bridge per node, and the portmap plugin for pods' hostPorts
	// (its iptables rules live in the node's namespace); host-local IPAM
	// keeps its leases in the node's folder (the default,
	// /var/lib/cni/networks, is shared by the host).
	// The network is named after the namespace, so what libcni caches
	// under /var/lib/cni/results is recognisably this node's.
	cni := fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": %q,
  "plugins": [{
    "type": "bridge", "bridge": "cbr0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}
  }, {
    "type": "portmap", "capabilities": {"portMappings": true}
  }]
}
`, n.NS, n.PodCIDR.String(), filepath.Join(n.Dir, "cni", "ipam"))
	if err := os.WriteFile(filepath.Join(n.Dir, "cni", "net.d", "10-bridge.conflist"), []byte(cni), 0o644); err != nil {
		t.Fatal(err)
	}
	d := func(p string) string { return filepath.Join(n.Dir, p) }
	config := fmt.Sprintf(`version = 2
root = %q
state = %q
# Snapshotters that probe for kernel modules or file systems this host
# lacks, and would only log why they cannot load.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = %q

[plugins."io.containerd.internal.v1.opt"]
  path = %q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  # The test runs as root without CAP_SYS_RESOURCE: runc may not lower
  # the sandbox's oom_score_adj below its own, and without this every pod
  # fails with "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  # The pods' network namespaces under the node's state folder, not in
  # the host's /run/netns: they go with the node.
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "runc"
        Root = %q
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %q
    max_conf_num = 1
`, d("containerd/root"), d("containerd/state"), n.Socket(), d("containerd/opt"), n.c.pauseRef, d("runc"), d("cni/net.d"))
	if err := os.WriteFile(d("containerd.toml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	path, args := n.inCgroup("/usr/bin/containerd", "--config", d("containerd.toml"), "--log-level", "warn")
	// containerd gets a UTS namespace of its own, named after the node:
	// hostNetwork pods share the UTS namespace of the runtime that starts
	// them, so they see the node's name as their hostname (as on a real
	// node), not the machine's.
	args = append([]string{"--uts", "/bin/sh", "-c", `hostname "$0" && exec "$@"`, n.Name, path}, args...)
	n.Containerd = netns.StartInNet(t, n.NS, "/usr/bin/unshare", args...)
	n.Containerd.Name = "containerd"
	deadline := time.Now().Add(time.Minute)
	for {
		out, err := exec.Command("ctr", "--address", n.Socket(), "version").CombinedOutput()
		if err == nil {
			return
		}
		if !n.Containerd.Running() || time.Now().After(deadline) {
			t.Fatalf("node %s: containerd does not answer on %s (running %v): %v %s\n%s", n.Name, n.Socket(),
				n.Containerd.Running(), err, out, tail(n.Containerd.Log(), 30))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startKubelet writes the kubelet's configuration and starts it. The Node
// object exists already (Cluster made it, with the pod range).
func (n *Node) startKubelet(kubeletBin, kubeconfig string) {
	t := n.c.t
	t.Helper()
	d := func(p string) string { return filepath.Join(n.Dir, p) }
	// Pods with dnsPolicy Default and hostNetwork pods resolve with this
	// file: a name server on the node's loopback, where nothing listens, so
	// a lookup fails at once and never leaves the namespace.
	if err := os.WriteFile(d("resolv.conf"), []byte("nameserver 127.0.0.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	config := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# The host runs cgroup v1, which the kubelet refuses unless told.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: %q
containerRuntimeEndpoint: unix://%s
address: %s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
# The API server reaches the kubelet (logs, exec) anonymously; the kubelet
# serves with a certificate it signs itself.
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
rotateCertificates: false
serverTLSBootstrap: false
failSwapOn: false
podLogsDir: %q
volumePluginDir: %q
resolvConf: %q
clusterDNS: [%s]
clusterDomain: cluster.local
# Images are imported, never pulled: never collect them. Evict only when
# the machine is really out of room.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 50Mi
  nodefs.available: 1%%
  nodefs.inodesFree: 1%%
  imagefs.available: 1%%
serializeImagePulls: false
maxPods: 50
nodeStatusUpdateFrequency: 4s
`, n.CgroupRoot(), n.Socket(), n.IP, d("pod-logs"), d("volume-plugins"), d("resolv.conf"), ClusterDNS)
	if err := os.WriteFile(d("kubelet.yaml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	path, args := n.inCgroup(kubeletBin,
		"--config", d("kubelet.yaml"),
		"--kubeconfig", kubeconfig,
		"--root-dir", d("kubelet"),
		"--cert-dir", d("kubelet/pki"),
		"--hostname-override", n.Name,
		"--node-ip", n.IP.String(),
		"--v", "0",
	)
	n.Kubelet = netns.StartInNet(t, n.NS, path, args...)
	n.Kubelet.Name = "kubelet"
}

// ImportImages imports a Docker-format tarball (test/image's Write) into
// the node's containerd, where the kubelet finds its images.
func (n *Node) ImportImages(tarball string) error {
	if err := importImages(n.Socket(), tarball); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	return nil
}

// Exec runs a command in the node's network namespace (keeping the test's
// mount namespace, so it sees the node's files) and returns its combined
// output.
func (n *Node) Exec(cmd ...string) (string, error) {
	args := append([]string{"--net=/run/netns/" + n.NS, "--"}, cmd...)
	out, err := exec.Command("nsenter", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("on %s: %s: %w: %s", n.Name, strings.Join(cmd, " "), err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

// Dial asks an echo server at addr from the node's own network namespace
// (as a hostNetwork pod would); see netns.Dial.
func (n *Node) Dial(network, addr string, timeout time.Duration) (string, error) {
	return netns.Dial(n.NS, network, addr, timeout)
}

// PodNetns returns the network namespace file of the pod on this node
// whose address is ip, for DialFrom. Pods with hostNetwork have none.
func (n *Node) PodNetns(ip netip.Addr) (string, error) {
	files, _ := filepath.Glob(filepath.Join(n.criStateDir(), "netns", "*"))
	for _, f := range files {
		found := false
		err := inNetns(f, func() error {
			addrs, err := net.InterfaceAddrs()
			if err != nil {
				return err
			}
			for _, a := range addrs {
				if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr() == ip {
					found = true
				}
			}
			return nil
		})
		if err == nil && found {
			return f, nil
		}
	}
	return "", fmt.Errorf("node %s: no pod network namespace holds %s (of %d)", n.Name, ip, len(files))
}

func inNetns(path string, fn func() error) error {
	h, err := vnetns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("enter %s: %w", path, err)
	}
	defer h.Close()
	return nsenter.Run(h, fn)
}

// DialConnFrom opens a connection from inside the network namespace file
// nsPath (a pod's, see PodNetns); it stays in that namespace for its life.
func DialConnFrom(ctx context.Context, nsPath, network, addr string) (net.Conn, error) {
	h, err := vnetns.GetFromPath(nsPath)
	if err != nil {
		return nil, fmt.Errorf("enter %s: %w", nsPath, err)
	}
	defer h.Close()
	return nsenter.DialContext(h)(ctx, network, addr)
}

// DialFrom asks an echo server at addr from inside the network namespace
// file nsPath (a pod's, see PodNetns) and returns its reply line; the
// exchange is netns.Dial's.
func DialFrom(nsPath, network, addr string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := DialConnFrom(ctx, nsPath, network, addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return netns.Ask(ctx, c)
}

// shimSockets lists the sockets containerd's shims listen on in network
// namespace ns (a node's), in the shared /run/containerd/s: a killed shim
// leaves its socket there.
func shimSockets(ns string) []string {
	var socks []string
	_ = netns.InNamespace(ns, func() error {
		b, err := os.ReadFile("/proc/thread-self/net/unix")
		if err != nil {
			return err
		}
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			if len(f) >= 8 && strings.HasPrefix(f[7], "/run/containerd/s/") {
				socks = append(socks, f[7])
			}
		}
		return nil
	})
	return socks
}

// destroy removes everything the node made outside its namespace (see
// removeNodeLeftovers).
func (n *Node) destroy() error {
	if n.NS == "" || n.Dir == "" {
		return nil
	}
	// The kubelet and containerd were stopped by their own cleanups (unless
	// the node failed half-way); the shims and the containers still run.
	if n.Kubelet != nil {
		n.Kubelet.Kill()
	}
	if n.Containerd != nil {
		n.Containerd.Kill()
	}
	return removeNodeLeftovers(n.NS)
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
