package e2e

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpproxy/kp/test/apiserver"
	"github.com/kpproxy/kp/test/netns"
)

// Upstream kube-proxy v1.36.3 (the binary the tests build) programs the
// node in its iptables, nftables or ipvs mode (ipvs in the VM:
// TestIPVSMigrationsInTheVM) and serves the traffic; kp
// (nftables) starts beside it, kube-proxy stops (as its pod leaving the
// node would), and kp migrate node --to nftables proves kp's path and
// removes kube-proxy's leftovers, while endpoints change: no new connection
// fails, the UDP flow loses nothing, the long-lived connection kube-proxy
// NATed survives, and no rule of kube-proxy's remains.
func TestMigrateNodeFromUpstreamKubeProxyDropsNothing(t *testing.T) {
	netns.Require(t, "nft", "iptables-nft-save", "iptables-legacy-save", "ip6tables-nft-save", "ip6tables-legacy-save", "conntrack")
	t.Parallel()
	for _, kubeMode := range []string{"iptables", "nftables", "ipvs"} {
		t.Run("kube-proxy-"+kubeMode+"-to-nftables", func(t *testing.T) {
			onlyWithIPVSInTheVM(t, kubeMode == "ipvs")
			if kubeMode == "ipvs" {
				netns.Require(t, "ipvsadm", "ipset")
			}
			k := newKubeEnv(t, modeNFTables, 5, apiserver.Options{})
			e := k.env
			pods := e.w.Pods()
			streamServer(t, pods[4])
			api := Service{Name: "api", ClusterIPs: []string{"10.96.0.11"},
				Ports: []Port{{Name: "http", Port: 80, TargetPort: 8080}}, Endpoints: endpoints(pods[1], pods[2])}
			k.apply(web(pods[0], pods[1], pods[2]))
			k.apply(api)
			k.apply(Service{Name: "stream", ClusterIPs: []string{"10.96.0.12"},
				Ports: []Port{{Name: "s", Port: 9000, TargetPort: 9090}}, Endpoints: endpoints(pods[4])})

			var udpTimeout []string
			if kubeMode == "ipvs" {
				// The UDP flow's virtual server stays while IPVS tracks
				// the flow: until this long after its last packet.
				udpTimeout = []string{"--ipvs-udp-timeout=10s"}
			}
			kubeProxy := netns.StartInNet(t, e.w.Node(), apiserver.Bin(t, apiserver.KubeProxy), append([]string{
				"--proxy-mode=" + kubeMode,
				"--hostname-override", nodeName,
				"--kubeconfig", k.source[1],
				"--cluster-cidr", e.w.ClusterCIDR(),
				"--conntrack-max-per-core=0",
				// Its periodic resync re-creates rules kp's take-over removed.
				"--iptables-sync-period=5s",
				// kp serves 10256 and 10249 on loopback.
				"--healthz-bind-address", "127.0.0.1:20256",
				"--metrics-bind-address", "127.0.0.1:20249",
				"--v", "2"}, udpTimeout...)...)
			if err := kubeProxy.WaitHTTP("http://127.0.0.1:20256/healthz", slow(2*time.Minute), func(code int, _ string) bool { return code == 200 }); err != nil {
				t.Fatalf("kube-proxy: %v\n%s", err, tail(kubeProxy.Log(), 40))
			}
			client := e.w.Client()
			for _, a := range []string{webTCP, apiTCP} {
				e.answers(client, "tcp", a)
			}
			e.answers(client, "udp", webUDP)
			// The long-lived connection must start tracked, as on a real
			// node, where conntrack is always on: kube-proxy's healthz and
			// its virtual servers come before its first iptables-restore,
			// and a connection IPVS took untracked is reset once that
			// restore's masquerade turns conntrack on (KF-10).
			e.conntrackTracks(client, webTCP)
			before := e.rulesOf()
			if kubeProxyRules(before) == 0 {
				t.Fatalf("kube-proxy's %s rules not found: %v", kubeMode, before)
			}
			t.Logf("kube-proxy's rules: %v", before)

			// The long-lived connection and the UDP flow are kube-proxy's.
			tr := startFlows(t, flows{loops: []loopFlow{{name: "from " + client, ns: client, addrs: []string{webTCP, apiTCP}}},
				stream: flowTo{client, streamTCP}, udp: flowTo{client, webUDP}, capture: e.w.Node()})
			time.Sleep(300 * time.Millisecond)
			// kp starts while kube-proxy still runs (a DaemonSet rollout's
			// overlap): its take-over removes kube-proxy's rules after its
			// first sync, and kube-proxy, at its next sync, writes them
			// again.
			e.startKP()
			e.logShows("kp's take-over", 15*time.Second, "removed kube-proxy's")
			k.apply(web(pods[0], pods[1], pods[2], pods[3]))
			e.eventually("kube-proxy writing its rules again", 90*time.Second, func() error {
				if n := kubeProxyRules(e.rulesOf()); n == 0 {
					return fmt.Errorf("none yet")
				}
				return nil
			})
			if err := kubeProxy.Stop(); err != nil {
				t.Logf("stop kube-proxy: %v", err)
			}
			time.Sleep(300 * time.Millisecond)

			apiPods := []*netns.Pod{pods[2], pods[3]}
			api.Endpoints = endpoints(apiPods...)
			type result struct {
				out string
				err error
			}
			done := make(chan result, 1)
			go func() { out, err := e.tryMigrate("--to", "nftables"); done <- result{out, err} }()
			time.Sleep(100 * time.Millisecond)
			k.apply(api)
			res := <-done
			if res.err != nil {
				t.Fatalf("kp migrate node --to nftables: %v\n%s\nkp's log:\n%s", res.err, res.out, tail(e.kp.Log(), 60))
			}
			t.Logf("kp migrate node --to nftables:\n%s", res.out)
			if !strings.Contains(res.out, "kube-proxy") || !strings.Contains(res.out, "remove   removed") {
				t.Errorf("the migration did not plan and remove kube-proxy's rules:\n%s", res.out)
			}
			if kubeMode == "ipvs" {
				// The long-lived connection's and the UDP flow's virtual
				// servers stay until they end (IPVS drops the packets of a
				// connection whose virtual server is gone).
				e.ipvsKeptOnly(streamTCP, webUDP)
			} else {
				e.expectOnly("nftables")
			}
			e.onlyFrom(client, apiTCP, apiPods...)
			time.Sleep(500 * time.Millisecond)
			tr.stop("")
			if kubeMode == "ipvs" {
				e.eventually("kube-proxy's last virtual server removed once its connection ended", time.Minute,
					func() error { return noIPVSState(e.w) })
				e.expectOnly("nftables")
			}
		})
	}
}

// The Node's kpproxy.io/proxy-mode annotation switches the running kp (as
// kp migrate node does, under the same traffic) and persists: kp restarted
// with its original flags starts in the annotated mode, with no gap.
func TestNodeAnnotationSwitchesModeAndPersistsAcrossRestart(t *testing.T) {
	netns.Require(t, "nft", "iptables-nft-save", "iptables-legacy-save", "ip6tables-nft-save", "ip6tables-legacy-save")
	k := newKubeEnv(t, modeNFTables, 5, apiserver.Options{})
	e := k.env
	pods := e.w.Pods()
	streamServer(t, pods[4])
	k.apply(web(pods[0], pods[1], pods[2]))
	k.apply(Service{Name: "api", ClusterIPs: []string{"10.96.0.11"},
		Ports: []Port{{Name: "http", Port: 80, TargetPort: 8080}}, Endpoints: endpoints(pods[1], pods[2])})
	k.apply(Service{Name: "stream", ClusterIPs: []string{"10.96.0.12"},
		Ports: []Port{{Name: "s", Port: 9000, TargetPort: 9090}}, Endpoints: endpoints(pods[4])})
	e.startKP()
	client := e.w.Client()
	e.answers(client, "tcp", webTCP)
	tr := startTraffic(t, client, []string{webTCP, apiTCP}, streamTCP, webUDP)

	annotate := func(mode string) {
		patch := fmt.Sprintf(`{"metadata":{"annotations":{"kpproxy.io/proxy-mode":%q}}}`, mode)
		if _, err := k.api.CoreV1().Nodes().Patch(k.ctx(), nodeName, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatalf("annotate Node %s: %v", nodeName, err)
		}
	}
	annotate("iptables-nft")
	e.logShows("the switch", 30*time.Second, "migration finished", `to="iptables-nft"`)
	e.expectOnly("iptables-nft")
	e.eventually("the Event on the Node", 10*time.Second, func() error {
		evs, err := k.api.CoreV1().Events("default").List(k.ctx(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + nodeName})
		if err != nil {
			return err
		}
		for _, ev := range evs.Items {
			if ev.Reason == "KPModeSwitched" && strings.Contains(ev.Message, "from nftables to iptables-nft") {
				t.Logf("event: %s", ev.Message)
				return nil
			}
		}
		return fmt.Errorf("no KPModeSwitched event among %d", len(evs.Items))
	})

	if err := e.kp.Restart(); err != nil {
		t.Fatal(err)
	}
	e.waitHealthy()
	e.logShows("the start in the annotated mode", 30*time.Second, "starting in the requested mode", `mode="iptables-nft"`, `configured="nftables"`)
	e.expectOnly("iptables-nft")
	if out := e.migrate("--to", "iptables-nft"); !strings.Contains(out, "Nothing to do") {
		t.Errorf("after the restart kp migrate node sees work left:\n%s", out)
	}
	time.Sleep(500 * time.Millisecond)
	tr.stop("")
}

// kubeProxyRules counts kube-proxy's tables and chains in a rulesOf
// listing.
func kubeProxyRules(rules map[string][]string) int {
	n := 0
	for _, list := range rules {
		for _, x := range list {
			if strings.HasSuffix(x, " kube-proxy") || strings.HasPrefix(x, "KUBE-") {
				n++
			}
		}
	}
	return n
}

// The Node annotation kpproxy.io/proxy-mode=none, without kp's
// --allow-mode-none, changes nothing — kp keeps its mode and rules and the
// Services answer, also after a restart (the annotation stays) — and kp
// says why in a Warning Event on the Node. Anyone who may patch Nodes
// could otherwise take the node's Services offline.
func TestNodeAnnotationNoneIsRefusedWithoutAllowModeNone(t *testing.T) {
	netns.Require(t, "nft")
	k := newKubeEnv(t, modeNFTables, 2, apiserver.Options{})
	e := k.env
	pods := e.w.Pods()
	k.apply(web(pods...))
	e.startKP()
	client := e.w.Client()
	e.answers(client, "tcp", webTCP)

	patch := `{"metadata":{"annotations":{"kpproxy.io/proxy-mode":"none"}}}`
	if _, err := k.api.CoreV1().Nodes().Patch(k.ctx(), nodeName, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("annotate Node %s: %v", nodeName, err)
	}
	e.logShows("the refusal", 30*time.Second, "ignoring the Node's proxy mode annotation", "--allow-mode-none")
	e.eventually("the Warning Event on the Node", 10*time.Second, func() error {
		evs, err := k.api.CoreV1().Events("default").List(k.ctx(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + nodeName})
		if err != nil {
			return err
		}
		for _, ev := range evs.Items {
			if ev.Type == "Warning" && ev.Reason == "KPModeSwitchFailed" && strings.Contains(ev.Message, "to none") &&
				strings.Contains(ev.Message, "--allow-mode-none") {
				t.Logf("event: %s", ev.Message)
				return nil
			}
		}
		return fmt.Errorf("no KPModeSwitchFailed Event naming --allow-mode-none among %d", len(evs.Items))
	})
	e.expectOnly("nftables")
	e.answers(client, "tcp", webTCP)

	if err := e.kp.Restart(); err != nil {
		t.Fatal(err)
	}
	e.waitHealthy()
	e.expectOnly("nftables")
	e.answers(client, "tcp", webTCP)
	if _, body, err := netns.HTTPGet(e.w.Node(), "http://"+metricsAddr+"/proxyMode", 2*time.Second); err != nil || body != "nftables" {
		t.Errorf("after a restart with the annotation still there: /proxyMode says %q (%v), want nftables", body, err)
	}
}

// conntrackTracks waits until the node tracks connections from ns to addr:
// a fresh one has a conntrack entry. A node namespace tracks nothing until
// a rule that needs conntrack is in it, and IPVS does not ask for it
// (TestKernelIPVSConnectionStartedWhileConntrackIsOffIsResetWhenAMasqueradeComesIn).
func (e *env) conntrackTracks(ns, addr string) {
	e.t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		e.t.Fatal(err)
	}
	e.eventually("the node tracking connections to "+addr, 2*time.Minute, func() error {
		if _, err := e.ask(ns, "tcp", addr); err != nil {
			return err
		}
		out, err := e.w.Exec(e.w.Node(), "conntrack", "-L", "-p", "tcp", "--orig-dst", host, "--orig-port-dst", port)
		if err != nil {
			return fmt.Errorf("conntrack -L: %v\n%s", err, out)
		}
		if !strings.Contains(out, "dport="+port) {
			return fmt.Errorf("no conntrack entry for a connection just made: nothing in the node needs conntrack yet")
		}
		return nil
	})
}
