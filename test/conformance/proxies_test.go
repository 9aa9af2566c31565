package conformance

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kpproxy/kp/test/apiserver"
	"github.com/kpproxy/kp/test/cluster"
	"github.com/kpproxy/kp/test/netns"
)

// kpImage is the reference kp's image is loaded under, and kpTag its tag.
const (
	kpTag   = "conformance"
	kpImage = "kp.local/kp:" + kpTag
)

// startKubeProxy returns the deploy function that runs upstream kube-proxy
// in mode on every node: a process in the node's network namespace, as a
// node's systemd unit would run it, with the admin's kubeconfig. Its logs
// go to out when the run ends.
func startKubeProxy(mode string) func(t *testing.T, c *cluster.Cluster, out string) {
	return func(t *testing.T, c *cluster.Cluster, out string) { runKubeProxy(t, c, out, mode) }
}

func runKubeProxy(t *testing.T, c *cluster.Cluster, out, mode string) {
	netns.Require(t, "nft", "iptables-save")
	bin := apiserver.Bin(t, apiserver.KubeProxy)
	kubeconfig := c.API.Kubeconfig(0, c.API.AdminToken())
	for _, n := range c.Nodes {
		p := netns.StartInNet(t, n.NS, bin,
			"--proxy-mode="+mode,
			"--hostname-override", n.Name,
			"--kubeconfig", kubeconfig,
			"--cluster-cidr", c.ClusterCIDR.String(),
			// The node's namespace shares the host's conntrack table size,
			// which only the root namespace may set.
			"--conntrack-max-per-core=0",
			"--v", "2",
		)
		t.Cleanup(func() {
			_ = os.WriteFile(filepath.Join(out, "kube-proxy-"+n.Name+".log"), []byte(p.Log()), 0o644)
		})
		url := "http://" + n.IP.String() + ":10256/healthz"
		if err := p.WaitHTTP(url, 2*time.Minute, func(code int, _ string) bool { return code == 200 }); err != nil {
			t.Fatalf("kube-proxy on %s: %v\n%s", n.Name, err, tailLines(p.Log(), 40))
		}
	}
}

// deployKP returns the deploy function that deploys kp in mode as users
// do: kubectl apply -k of manifests/ with the test's image, the cluster's
// addresses and the mode in the config file.
func deployKP(mode string) func(t *testing.T, c *cluster.Cluster, out string) {
	return func(t *testing.T, c *cluster.Cluster, _ string) {
		if err := c.DeployKP(kpTag, 3*time.Minute, cluster.KPMode(mode)); err != nil {
			t.Fatal(err)
		}
	}
}
