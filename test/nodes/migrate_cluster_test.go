package nodes

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpproxy/kp/proxy/statusapi"
	"github.com/kpproxy/kp/test/cluster"
	"github.com/kpproxy/kp/test/image"
	"github.com/kpproxy/kp/test/netns"
)

// TestMigrateClusterOnRealNodes runs kp migrate cluster, the built binary,
// against two real nodes while a client pod's new connections, a node's
// new connections and one long-lived connection run through all of it:
// from upstream kube-proxy's DaemonSet (iptables mode) to kp, node by
// node; then --to iptables with node-1's kp kept from Ready (the cluster
// autoscaler's deletion taint fails its /healthz): the rollout pauses
// there with node-2 untouched, and resumes once the taint is gone; then
// --rollback back to nftables.
func TestMigrateClusterOnRealNodes(t *testing.T) { testMigrateCluster(t, "nft") }

// TestMigrateClusterOnRealLegacyNodes is TestMigrateClusterOnRealNodes on
// nodes whose iptables is iptables-legacy: the nodes' `iptables`
// alternative (so kubelet's chains and the CNI's are in legacy) and
// kube-proxy's image's (so are its rules). kp, its DaemonSet as shipped
// (NET_ADMIN and NET_RAW), must read and remove kube-proxy's rules there,
// and its iptables mode (--to iptables) must write there.
func TestMigrateClusterOnRealLegacyNodes(t *testing.T) { testMigrateCluster(t, "legacy") }

// testMigrateCluster is the test on nodes whose iptables backend is
// backend ("nft" or "legacy").
func testMigrateCluster(t *testing.T, backend string) {
	netns.Require(t, "nft", "iptables-nft-save", "iptables-legacy-save")
	begin := time.Now()
	phase := func(name string, start time.Time) {
		t.Logf("TIMING %s: %v", name, time.Since(start).Round(100*time.Millisecond))
	}
	t.Cleanup(func() { phase("whole test (with teardown)", begin) })
	start := time.Now()
	kpBin, err := netns.BuildStatic("./cmd/kp")
	if err != nil {
		t.Fatal(err)
	}
	echo, err := cluster.EchoImage()
	if err != nil {
		t.Fatal(err)
	}
	full := cluster.KPImage(t, kpBin, kpImage)
	c := cluster.Start(t, cluster.Options{Nodes: 2, IPTables: backend, Images: []image.Image{echo, full, kubeProxyImage(t, backend)}})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	t.Cleanup(func() {
		if t.Failed() {
			dumpKP(t, c)
			if out, err := c.Kubectl("logs", "-n", "kube-system", "-l", "k8s-app=kube-proxy", "--tail", "30"); err == nil {
				t.Logf("kube-proxy logs:\n%s", out)
			}
		}
	})
	phase("build and cluster start", start)

	start = time.Now()
	apply(t, c, kubeProxyManifest(c, kubeProxyRef(backend)))
	apply(t, c, workload)
	apply(t, c, streamService(n1.IP))
	lineServer(t, n1.NS, netip.AddrPortFrom(n1.IP, 9100).String())
	waitFor(t, "kube-proxy's DaemonSet Ready on both nodes, the workload ready", 3*time.Minute, func() string {
		if s := podsReady(t, c, "kube-system", "k8s-app=kube-proxy", 2); s != "" {
			return s
		}
		if s := webReady(t, c, 2); s != "" {
			return s
		}
		return podReady(t, c, "client")
	})
	client, err := c.Client().CoreV1().Pods("default").Get(ctx(t), "client", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	clientNS, err := n2.PodNetns(netip.MustParseAddr(client.Status.PodIP))
	if err != nil {
		t.Fatal(err)
	}
	clusterIP := serviceAddr(t, c, "web", 80)
	streamAddr := serviceAddr(t, c, "stream", 9100)
	waitFor(t, "kube-proxy to serve the ClusterIP on both nodes", time.Minute, func() string {
		if _, err := cluster.DialFrom(clientNS, "tcp", clusterIP, 2*time.Second); err != nil {
			return "from pod client: " + err.Error()
		}
		if _, err := n1.Dial("tcp", clusterIP, 2*time.Second); err != nil {
			return "from node-1: " + err.Error()
		}
		return ""
	})
	for _, n := range c.Nodes {
		if chains, err := kubeProxyChains(n); err != nil || len(chains) == 0 {
			t.Fatalf("%s: no kube-proxy chain in the kernel (%v)", n.Name, err)
		}
		checkNodeBackend(t, n, backend)
		// The probes above that came before kube-proxy's rules left
		// connection attempts never DNATed in the node's conntrack
		// (SYN_SENT, for two minutes): a new connection reusing one's
		// source port would match it and pass DNAT. kp deletes them at its
		// first sync (see docs/conntrack.md); kube-proxy, which
		// serves first here, does not, so the test does, before counting.
		_, _ = n.Exec("conntrack", "-D", "-p", "tcp", "--orig-dst", netip.MustParseAddrPort(clusterIP).Addr().String(), "--state", "SYN_SENT")
	}
	phase("kube-proxy DaemonSet and workload", start)

	fromPod := connLoop(fromPodNS(clientNS), clusterIP, onNodes(c))
	fromNode1 := connLoop(fromNode(n1), clusterIP, onNodes(c))
	stream := startLongLived(t, clientNS, streamAddr)
	defer fromPod.Stop()
	defer fromNode1.Stop()
	defer stream.Stop()

	// The hand-back to kube-proxy (--from-kube-proxy --rollback) and a
	// second migration from it: the first migration then keeps kube-proxy's
	// DaemonSet (the default), the second deletes it (--delete-kube-proxy).
	// KP_MIGRATE_QUICK=1 leaves them out (37 s) for a quicker local run, and
	// deletes the DaemonSet in the first.
	handback := os.Getenv("KP_MIGRATE_QUICK") == ""
	fromKubeProxy := []string{"--from-kube-proxy", "--node-timeout", "3m"}
	if !handback {
		fromKubeProxy = append(fromKubeProxy, "--delete-kube-proxy")
	}
	var kpConfigMap string
	t.Run("the preflight reads kube-proxy's ConfigMap and both nodes; --print-config writes kp's from it", func(t *testing.T) {
		start := time.Now()
		kpConfigMap = checkPreflight(t, c, kpBin)
		phase("preflight and --print-config", start)
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("from kube-proxy: node by node, kube-proxy's rules serve until kp has synced, none left, its DaemonSet kept", func(t *testing.T) {
		start := time.Now()
		out, err := kpMigrate(t, c, kpBin, fromKubeProxy...)
		if err == nil || !strings.Contains(out, "apply kp's manifests now") {
			t.Fatalf("the first run, before kp's DaemonSet exists: want it to ask for kp's manifests; err %v", err)
		}
		for _, n := range c.Nodes {
			if l := nodeLabel(t, c, n.Name, "kpproxy.io/proxy"); l != "kube-proxy" {
				t.Errorf("%s: label kpproxy.io/proxy=%q after the first run, want kube-proxy", n.Name, l)
			}
		}
		// The hand-back switches kp to mode none through the Node
		// annotation, which kp refuses unless it runs with
		// --allow-mode-none, as kp migrate cluster --help says.
		var kpOpts []cluster.KPOption
		if handback {
			kpOpts = append(kpOpts, cluster.KPArgs("--allow-mode-none"))
		}
		if out, err := c.Kubectl("apply", "-k", kpOverlay(t, c, "e2e", kpOpts...)); err != nil {
			t.Fatalf("kubectl apply -k: %v\n%s", err, out)
		}
		// kp serves with the ConfigMap --print-config wrote from
		// kube-proxy's, in place of the overlay's.
		apply(t, c, kpConfigMap)
		checkPreflightWithKPsConfigMap(t, c, kpBin)
		// From here: the first run rolled kube-proxy's pods over (their
		// new affinity), which is no node's turn.
		w := watchNodes(t, c)
		if _, err := kpMigrate(t, c, kpBin, fromKubeProxy...); err != nil {
			t.Fatal(err)
		}
		checkTakeOverOrder(t, w.Stop(), n1.Name, n2.Name)
		checkTakenOver(t, c, !handback)
		checkEvents(t, c, n1.Name, "take-over")
		phase("migrate cluster --from-kube-proxy", start)
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("--to iptables pauses at node-1, whose kp is not Ready, leaves node-2 untouched, resumes once fixed", func(t *testing.T) {
		start := time.Now()
		// The cluster autoscaler's deletion taint makes kp's /healthz, and
		// so its pod's readiness, fail (as upstream's): node-1's kp cannot
		// reach Ready.
		if out, err := c.Kubectl("taint", "node", n1.Name, "ToBeDeletedByClusterAutoscaler=1:NoSchedule"); err != nil {
			t.Fatalf("kubectl taint: %v\n%s", err, out)
		}
		waitFor(t, "kp's pod on node-1 not Ready", time.Minute, func() string {
			for _, p := range kpPods(t, c) {
				if p.Spec.NodeName == n1.Name && cluster.PodReady(&p) {
					return "still Ready"
				}
			}
			return ""
		})
		out, err := kpMigrate(t, c, kpBin, "--to", "iptables", "--node-timeout", "10s")
		if err == nil || !strings.Contains(out, "node node-1: step read") || !strings.Contains(out, "not Ready") {
			t.Fatalf("want the rollout to pause at node node-1, step read, kp not Ready; err %v", err)
		}
		rec := nodeRecord(t, c, n1.Name)
		if rec["phase"] != "failed" || rec["step"] != "read" {
			t.Errorf("node-1's record after the pause: %v, want phase failed at step read", rec)
		}
		if st := kpStatusOn(t, n2); st.Mode != "nftables" {
			t.Errorf("node-2 runs %s after the pause at node-1, want it untouched (nftables)", st.Mode)
		}
		if a := nodeAnnotation(t, c, n2.Name, "kpproxy.io/proxy-mode"); a != "" {
			t.Errorf("node-2 annotated kpproxy.io/proxy-mode=%s after the pause at node-1, want it untouched", a)
		}
		phase("--to iptables up to the pause", start)

		start = time.Now()
		if out, err := c.Kubectl("taint", "node", n1.Name, "ToBeDeletedByClusterAutoscaler-"); err != nil {
			t.Fatalf("kubectl taint -: %v\n%s", err, out)
		}
		out, err = kpMigrate(t, c, kpBin, "--to", "iptables", "--node-timeout", "2m")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "resume: failed at step read") {
			t.Errorf("the re-run did not resume node-1")
		}
		for _, n := range c.Nodes {
			// kp's iptables mode writes where kubelet does (its hint chain).
			if st := kpStatusOn(t, n); st.Mode != "iptables" || !st.Healthy || st.IPTablesBackend != backend {
				t.Errorf("%s: kp runs %s (%s), healthy %v after the resumed rollout; want iptables-%s", n.Name, st.Mode, st.IPTablesBackend, st.Healthy, backend)
			}
			if rec := nodeRecord(t, c, n.Name); rec["phase"] != "done" || rec["previous"] != "nftables" {
				t.Errorf("%s: record %v, want done with previous nftables", n.Name, rec)
			}
		}
		checkEvents(t, c, n2.Name, "switch")
		phase("--to iptables resumed", start)
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("--rollback returns every node to nftables and removes the annotations", func(t *testing.T) {
		start := time.Now()
		if _, err := kpMigrate(t, c, kpBin, "--to", "iptables", "--rollback", "--node-timeout", "2m"); err != nil {
			t.Fatal(err)
		}
		for _, n := range c.Nodes {
			if st := kpStatusOn(t, n); st.Mode != "nftables" || !st.Healthy {
				t.Errorf("%s: kp runs %s, healthy %v after the rollback; want nftables", n.Name, st.Mode, st.Healthy)
			}
			for _, a := range []string{"kpproxy.io/proxy-mode", "kpproxy.io/migration"} {
				if v := nodeAnnotation(t, c, n.Name, a); v != "" {
					t.Errorf("%s: annotation %s=%s after the rollback", n.Name, a, v)
				}
			}
		}
		phase("--to iptables --rollback", start)
	})

	if handback && !t.Failed() {
		t.Run("--from-kube-proxy --rollback hands each node back to kube-proxy with no gap", func(t *testing.T) {
			start := time.Now()
			w := watchNodes(t, c)
			if _, err := kpMigrate(t, c, kpBin, "--from-kube-proxy", "--rollback", "--node-timeout", "2m"); err != nil {
				t.Fatal(err)
			}
			samples := w.Stop()
			for node, ss := range samples {
				for _, s := range ss {
					if s.kubeChains == 0 && !s.kpTable {
						t.Errorf("%s at %s: neither kube-proxy's rules nor kp's in the kernel", node, s.at.Format("15:04:05.000"))
					}
				}
			}
			waitFor(t, "kube-proxy's pods Ready on both nodes, kp's gone", time.Minute, func() string {
				if s := podsReady(t, c, "kube-system", "k8s-app=kube-proxy", 2); s != "" {
					return s
				}
				if n := len(kpPods(t, c)); n != 0 {
					return fmt.Sprintf("%d kp pods", n)
				}
				return ""
			})
			for _, n := range c.Nodes {
				if chains, err := kubeProxyChains(n); err != nil || len(chains) == 0 {
					t.Errorf("%s: no kube-proxy chain after the hand-back (%v)", n.Name, err)
				}
				if out, err := n.Exec("nft", "list", "tables"); err != nil || strings.Contains(out, " kp") {
					t.Errorf("%s: kp's tables after the hand-back: %q (%v)", n.Name, out, err)
				}
				if l := nodeLabel(t, c, n.Name, "kpproxy.io/proxy"); l != "kube-proxy" {
					t.Errorf("%s: label kpproxy.io/proxy=%q after the hand-back", n.Name, l)
				}
				for _, a := range []string{"kpproxy.io/proxy-mode", "kpproxy.io/migration"} {
					if v := nodeAnnotation(t, c, n.Name, a); v != "" {
						t.Errorf("%s: annotation %s=%s after the hand-back", n.Name, a, v)
					}
				}
			}
			phase("--from-kube-proxy --rollback", start)

			start = time.Now()
			w = watchNodes(t, c)
			if _, err := kpMigrate(t, c, kpBin, "--from-kube-proxy", "--delete-kube-proxy", "--node-timeout", "3m"); err != nil {
				t.Fatal(err)
			}
			checkTakeOverOrder(t, w.Stop(), n1.Name, n2.Name)
			checkTakenOver(t, c, true)
			phase("--from-kube-proxy again, deleting kube-proxy's DaemonSet", start)
		})
	}

	t.Run("no new connection failed and the long-lived connection survived all of it", func(t *testing.T) {
		time.Sleep(time.Second)
		for name, l := range map[string]*netns.Loop{"pod client on node-2": fromPod, "node-1": fromNode1} {
			s := l.Stop()
			t.Logf("%s to ClusterIP %s: %s", name, clusterIP, s)
			if err := s.Err(); err != nil {
				t.Errorf("%s to ClusterIP %s: %v", name, clusterIP, err)
			}
		}
		n, err := stream.Stop()
		if err != nil {
			t.Errorf("the long-lived connection to %s broke after %d exchanges: %v", streamAddr, n, err)
		} else {
			t.Logf("the long-lived connection to %s: %d exchanges, unbroken", streamAddr, n)
		}
	})
}

// checkTakenOver checks every node runs kp (nftables) with no kube-proxy
// chain left, and kube-proxy's DaemonSet deleted (or kept, running
// nowhere).
func checkTakenOver(t *testing.T, c *cluster.Cluster, deleted bool) {
	t.Helper()
	for _, n := range c.Nodes {
		if chains, err := kubeProxyChains(n); err != nil || len(chains) > 0 {
			t.Errorf("%s: kube-proxy's chains left: %v (%v)", n.Name, chains, err)
		}
		if st := kpStatusOn(t, n); st.Mode != "nftables" || !st.Healthy {
			t.Errorf("%s: kp runs %s, healthy %v; want nftables, healthy", n.Name, st.Mode, st.Healthy)
		}
	}
	ds, err := c.Client().AppsV1().DaemonSets("kube-system").Get(ctx(t), "kube-proxy", metav1.GetOptions{})
	switch {
	case deleted && !apierrors.IsNotFound(err):
		t.Errorf("kube-proxy's DaemonSet after the migration: %v, want it deleted", err)
	case !deleted && (err != nil || ds.Status.DesiredNumberScheduled != 0):
		t.Errorf("kube-proxy's DaemonSet after the migration without --delete-kube-proxy: %v, want it kept, on no node", err)
	}
}

// checkTakeOverOrder checks the samples of a --from-kube-proxy rollout:
// on every node, at every look, kube-proxy's rules or kp's were in the
// kernel; first moved first, and its kube-proxy rules were gone (kp's in
// place) before second's kube-proxy pod left.
func checkTakeOverOrder(t *testing.T, samples map[string][]sample, first, second string) {
	t.Helper()
	left := map[string]time.Time{}
	for node, ss := range samples {
		for _, s := range ss {
			if s.kubeChains == 0 && !s.kpTable {
				t.Errorf("%s at %s: neither kube-proxy's rules nor kp's in the kernel", node, s.at.Format("15:04:05.000"))
			}
			if !s.kubeProxyPod && left[node].IsZero() {
				left[node] = s.at
			}
		}
		t.Logf("%s: %d looks; kube-proxy's pod gone from %s", node, len(ss), left[node].Format("15:04:05.000"))
	}
	if left[first].IsZero() || left[second].IsZero() || !left[first].Before(left[second]) {
		t.Fatalf("kube-proxy left %s at %v and %s at %v: want %s first", first, left[first], second, left[second], first)
	}
	var before *sample
	for i, s := range samples[first] {
		if s.at.Before(left[second]) {
			before = &samples[first][i]
		}
	}
	if before == nil || before.kubeChains != 0 || !before.kpTable {
		t.Errorf("when kube-proxy left %s, %s was not done yet (last look: %+v)", second, first, before)
	}
}

func serviceAddr(t *testing.T, c *cluster.Cluster, name string, port uint16) string {
	t.Helper()
	svc, err := c.Client().CoreV1().Services("default").Get(ctx(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), port).String()
}

// kpStatusOn reads kp's status API on the node's loopback.
func kpStatusOn(t *testing.T, n *cluster.Node) *statusapi.Status {
	t.Helper()
	st, err := kpStatus(n)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func nodeLabel(t *testing.T, c *cluster.Cluster, node, key string) string {
	n, err := c.Client().CoreV1().Nodes().Get(ctx(t), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Labels[key]
}

func nodeAnnotation(t *testing.T, c *cluster.Cluster, node, key string) string {
	n, err := c.Client().CoreV1().Nodes().Get(ctx(t), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Annotations[key]
}

func nodeRecord(t *testing.T, c *cluster.Cluster, node string) map[string]any {
	rec := map[string]any{}
	if s := nodeAnnotation(t, c, node, "kpproxy.io/migration"); s != "" {
		if err := json.Unmarshal([]byte(s), &rec); err != nil {
			t.Fatal(err)
		}
	}
	return rec
}

// checkEvents checks the rollout recorded its steps as Events on node.
func checkEvents(t *testing.T, c *cluster.Cluster, node, step string) {
	t.Helper()
	evs, err := c.Client().CoreV1().Events("default").List(ctx(t), metav1.ListOptions{FieldSelector: "involvedObject.name=" + node})
	if err != nil {
		t.Fatal(err)
	}
	var steps []string
	for _, e := range evs.Items {
		if e.Reason == "KPMigration" {
			steps = append(steps, e.Message)
		}
	}
	if !strings.Contains(strings.Join(steps, "\n"), step) {
		t.Errorf("node %s: no KPMigration Event of step %s; its Events: %v", node, step, steps)
	}
}
