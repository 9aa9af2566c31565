package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kpproxy/kp/test/apiserver"
	"github.com/kpproxy/kp/test/image"
	"github.com/kpproxy/kp/test/images"
	"github.com/kpproxy/kp/test/netns"
)

// Addresses every cluster uses (each lives in namespaces of its own, so
// clusters in parallel do not collide).
var (
	// DefaultClusterCIDR holds the pods of every node: node-i gets
	// 10.251.i.0/24.
	DefaultClusterCIDR = netip.MustParsePrefix("10.251.0.0/16")
	// ServiceCIDR is the Service range (--service-cluster-ip-range).
	ServiceCIDR = netip.MustParsePrefix("10.96.0.0/16")
)

// ClusterDNS is the kubelet's clusterDNS: the address a cluster DNS
// Service would take. Nothing answers there unless a test deploys one.
const ClusterDNS = "10.96.0.10"

// readyTimeout bounds each wait of bring-up: generous, for a busy 2-core
// machine (the usual is 10-20 s per node).
const readyTimeout = 3 * time.Minute

// Options shape a cluster.
type Options struct {
	// Nodes is the number of nodes, node-1 … node-N (default 2, at most
	// 200).
	Nodes int
	// Images are imported into every node before its kubelet starts,
	// besides the pause image (see LoadImages for later ones).
	Images []image.Image
	// IPTables is the iptables backend of the nodes' own tools, as the
	// node's `iptables` alternative: "nft" (the default, as the host's) or
	// "legacy". The kubelet (its KUBE-IPTABLES-HINT and KUBE-KUBELET-CANARY
	// chains) and the CNI plugins (portmap) run `iptables` from it.
	IPTables string
}

// Cluster is a running cluster: an API server with a controller-manager
// and a scheduler, and its nodes, all Ready.
type Cluster struct {
	API               *apiserver.Server
	ControllerManager *netns.Process
	Scheduler         *netns.Process
	Nodes             []*Node
	ClusterCIDR       netip.Prefix

	t        testing.TB
	dir      string
	pauseRef string // every node's sandbox image
	// iptablesDir, when set, holds the nodes' iptables alternative (links
	// to the legacy tools), first on the PATH of their daemons.
	iptablesDir string
}

// Start brings a cluster up and waits until every node is Ready and the
// controllers have made the default service account; everything is torn
// down when t ends, whatever its outcome (see the package doc). When t
// fails, the cluster's state (nodes, pods, events) is logged first. It
// skips t when not root or when the binaries are not built (make
// kube-bins; a failure under CI).
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	netns.Require(t, "nsenter", "unshare", "containerd", "containerd-shim-runc-v2", "ctr", "runc")
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		skip := t.Skipf
		if os.Getenv("CI") != "" {
			skip = t.Fatalf
		}
		skip("skipped: no CNI plugins in /usr/lib/cni (apt-get install containernetworking-plugins)")
	}
	cmBin := apiserver.Bin(t, apiserver.KubeControllerManager)
	schedBin := apiserver.Bin(t, apiserver.KubeScheduler)
	kubeletBin := apiserver.Bin(t, apiserver.Kubelet)
	apiserver.Bin(t, apiserver.Kubectl)
	if opts.Nodes <= 0 {
		opts.Nodes = 2
	}
	if opts.Nodes > 200 {
		t.Fatalf("cluster: %d nodes; at most 200", opts.Nodes)
	}
	sweepOnce.Do(func() {
		for _, err := range SweepStale() {
			t.Logf("sweep stale clusters: %v", err)
		}
	})
	start := time.Now()
	c := &Cluster{t: t, dir: t.TempDir(), ClusterCIDR: DefaultClusterCIDR}
	if err := c.iptablesAlternative(opts.IPTables); err != nil {
		t.Fatalf("cluster: %v", err)
	}

	// The kubelets rewrite these kernel settings at start: put them back
	// when the last cluster of the process is gone (registered first, so it
	// runs after every node's processes are stopped).
	restore, err := saveSysctls()
	if err != nil {
		t.Fatalf("cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := restore(); err != nil {
			t.Errorf("cluster: %v", err)
		}
	})

	c.API = apiserver.Start(t, apiserver.Options{
		ServiceCIDRs: []netip.Prefix{ServiceCIDR},
		// Logs, exec and port-forward go from the API server to the
		// kubelet: by its address, not by the node's name, which no DNS
		// resolves here.
		ExtraArgs: []string{"--kubelet-preferred-address-types=InternalIP"},
	})
	admin := c.API.Kubeconfig(0, c.API.AdminToken())
	c.ControllerManager = netns.StartIn(t, c.API.NS(), cmBin,
		"--kubeconfig", admin,
		"--bind-address", "127.0.0.1",
		"--leader-elect=false",
		// The service account token controller signs with the API
		// server's key; the root CA publisher puts the CA in every
		// namespace's kube-root-ca.crt, which pods' projected tokens need.
		"--service-account-private-key-file", c.API.ServiceAccountKeyFile(),
		"--root-ca-file", c.API.CAFile(),
		"--cluster-cidr", c.ClusterCIDR.String(),
		"--service-cluster-ip-range", ServiceCIDR.String(),
		// Node ranges are given by the harness (it writes each node's CNI
		// configuration before the kubelet starts).
		"--allocate-node-cidrs=false",
		// Its default is under /usr/libexec, which it would create.
		"--flex-volume-plugin-dir", filepath.Join(c.dir, "flex-volume"),
		"--controllers", "*",
		"--v", "0",
	)
	c.Scheduler = netns.StartIn(t, c.API.NS(), schedBin,
		"--kubeconfig", admin,
		"--bind-address", "127.0.0.1",
		"--leader-elect=false",
		"--v", "0",
	)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- cluster state at the failure ---\n%s", c.Dump())
		}
	})

	// The sandbox image is the e2e suite's pause (make test-images), so
	// the kubelet and upstream's tests agree on it.
	pause := images.Get(t, images.Pause)
	c.pauseRef = pause.Ref
	tarballs := []string{pause.Tarball}
	if len(opts.Images) > 0 {
		tarball, err := writeImages(c.dir, opts.Images...)
		if err != nil {
			t.Fatalf("cluster: %v", err)
		}
		tarballs = append(tarballs, tarball)
	}
	for i := 1; i <= opts.Nodes; i++ {
		n := &Node{
			Name:    fmt.Sprintf("node-%d", i),
			PodCIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 251, byte(i), 0}), 24),
			c:       c,
		}
		c.Nodes = append(c.Nodes, n)
		n.prepare()
		n.startContainerd()
		for _, tb := range tarballs {
			if err := n.ImportImages(tb); err != nil {
				t.Fatalf("cluster: %v", err)
			}
		}
	}
	// Each node routes the others' pod ranges to them over the bridge.
	for _, a := range c.Nodes {
		for _, b := range c.Nodes {
			if a != b {
				if err := netns.IP("-n", a.NS, "route", "add", b.PodCIDR.String(), "via", b.IP.String()); err != nil {
					t.Fatalf("cluster: %v", err)
				}
			}
		}
	}
	// The Node objects come first, with their pod ranges (as the
	// controller-manager's IPAM would set them): the kubelet finds its
	// Node there and keeps the range.
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	client := c.Client()
	for _, n := range c.Nodes {
		node := &v1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: map[string]string{
				"kubernetes.io/hostname": n.Name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
			}},
			Spec: v1.NodeSpec{PodCIDR: n.PodCIDR.String(), PodCIDRs: []string{n.PodCIDR.String()}},
		}
		if _, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatalf("cluster: create Node %s: %v", n.Name, err)
		}
	}
	for _, n := range c.Nodes {
		n.startKubelet(kubeletBin, admin)
	}
	if err := c.WaitNodesReady(readyTimeout); err != nil {
		t.Fatalf("cluster: %v", err)
	}
	// Pods cannot be created in a namespace before its default service
	// account exists (the admission plugin refuses them).
	if err := poll(ctx, func() (bool, error) {
		_, err := client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	}); err != nil {
		t.Fatalf("cluster: waiting for the controller-manager to make service account default/default: %v", err)
	}
	t.Logf("cluster of %d nodes up in %v", len(c.Nodes), time.Since(start).Round(100*time.Millisecond))
	return c
}

// Client is an admin client of the API server.
func (c *Cluster) Client() kubernetes.Interface { return c.API.Client() }

// Kubectl runs kubectl as the admin (inside the API server's namespace)
// and returns its combined output.
func (c *Cluster) Kubectl(args ...string) (string, error) { return c.API.Kubectl(args...) }

// KubectlCommand is the command line that runs kubectl as the admin with
// args, for a test that runs it itself: in a terminal (kubectl exec -it
// under tmux), in the background, or with its own stdin.
func (c *Cluster) KubectlCommand(args ...string) []string {
	c.t.Helper()
	kubeconfig := c.API.Kubeconfig(0, c.API.AdminToken())
	return append([]string{"ip", "netns", "exec", c.API.NS(), apiserver.Bin(c.t, apiserver.Kubectl),
		"--kubeconfig", kubeconfig}, args...)
}

// Node returns the node named name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// LoadImages writes imgs into one tarball and imports it into every node.
func (c *Cluster) LoadImages(imgs ...image.Image) error {
	tarball, err := writeImages(c.dir, imgs...)
	if err != nil {
		return err
	}
	defer os.Remove(tarball)
	for _, n := range c.Nodes {
		if err := n.ImportImages(tarball); err != nil {
			return err
		}
	}
	return nil
}

// WaitNodesReady waits until every node reports Ready, and says which are
// not (with their conditions) when timeout passes, or which kubelet exited.
func (c *Cluster) WaitNodesReady(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last string
	err := poll(ctx, func() (bool, error) {
		var notReady []string
		for _, n := range c.Nodes {
			if !n.Kubelet.Running() {
				return false, fmt.Errorf("the kubelet of %s exited: %v\n%s", n.Name, n.Kubelet.ExitErr(), tail(n.Kubelet.Log(), 40))
			}
			node, err := c.Client().CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				notReady = append(notReady, fmt.Sprintf("%s: %v", n.Name, err))
				continue
			}
			ready := false
			var conds []string
			for _, cond := range node.Status.Conditions {
				conds = append(conds, fmt.Sprintf("%s=%s (%s)", cond.Type, cond.Status, cond.Message))
				if cond.Type == v1.NodeReady && cond.Status == v1.ConditionTrue {
					ready = true
				}
			}
			if !ready {
				notReady = append(notReady, fmt.Sprintf("%s: %s", n.Name, strings.Join(conds, ", ")))
			}
		}
		last = strings.Join(notReady, "; ")
		return len(notReady) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("waiting %v for every node to be Ready: %w; not ready: %s", timeout, err, last)
	}
	return nil
}

// Dump describes the cluster for a failure message: nodes, every pod with
// its node and address, recent events.
func (c *Cluster) Dump() string {
	var b strings.Builder
	for _, args := range [][]string{
		{"get", "nodes", "-o", "wide"},
		{"get", "pods", "-A", "-o", "wide"},
		{"get", "events", "-A", "--sort-by=.lastTimestamp"},
	} {
		out, err := c.Kubectl(args...)
		fmt.Fprintf(&b, "$ kubectl %s\n%s", strings.Join(args, " "), out)
		if err != nil {
			fmt.Fprintf(&b, "(%v)\n", err)
		}
	}
	return b.String()
}

// poll calls cond every 200 ms until it is true, returns an error, or ctx
// ends.
func poll(ctx context.Context, cond func() (bool, error)) error {
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// iptablesAlternative makes the nodes' `iptables` (and ip6tables, their
// -save and -restore) the backend's tools, as update-alternatives does on a
// node: links in a folder first on the PATH of each node's daemons
// (inCgroup). The host's own alternative stays as it is.
func (c *Cluster) iptablesAlternative(backend string) error {
	switch backend {
	case "", "nft":
		return nil
	case "legacy":
	default:
		return fmt.Errorf("iptables backend %q: want nft or legacy", backend)
	}
	c.iptablesDir = filepath.Join(c.dir, "iptables-"+backend)
	if err := os.MkdirAll(c.iptablesDir, 0o755); err != nil {
		return err
	}
	for _, tool := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			target, err := exec.LookPath(tool + "-" + backend + suffix)
			if err != nil {
				return fmt.Errorf("the nodes' iptables-%s: %w", backend, err)
			}
			if err := os.Symlink(target, filepath.Join(c.iptablesDir, tool+suffix)); err != nil {
				return err
			}
		}
	}
	return nil
}
