package nodes

import (
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpproxy/kp/test/cluster"
	"github.com/kpproxy/kp/test/image"
	"github.com/kpproxy/kp/test/netns"
	"github.com/kpproxy/kp/test/tmux"
)

func TestMain(m *testing.M) { os.Exit(netns.Main(m)) }

// The workload: echo servers behind a ClusterIP and a NodePort Service,
// spread over the nodes, and a client pod pinned to node-2.
const workload = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: default
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      terminationGracePeriodSeconds: 5
      topologySpreadConstraints:
        - maxSkew: 1
          topologyKey: kubernetes.io/hostname
          whenUnsatisfiable: DoNotSchedule
          labelSelector:
            matchLabels: {app: web}
      containers:
        - name: echo
          image: kp.local/echo:e2e
          imagePullPolicy: Never
          args: ["-name", "$(POD_NAME)", "-listen", ":8080"]
          env:
            - name: POD_NAME
              valueFrom:
                fieldRef: {fieldPath: metadata.name}
          ports:
            - containerPort: 8080
          readinessProbe:
            tcpSocket: {port: 8080}
            periodSeconds: 1
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: default
spec:
  selector: {app: web}
  ports:
    - port: 80
      targetPort: 8080
---
apiVersion: v1
kind: Service
metadata:
  name: web-np
  namespace: default
spec:
  type: NodePort
  selector: {app: web}
  ports:
    - port: 80
      targetPort: 8080
---
apiVersion: v1
kind: Pod
metadata:
  name: client
  namespace: default
spec:
  nodeSelector:
    kubernetes.io/hostname: node-2
  terminationGracePeriodSeconds: 1
  containers:
    - name: echo
      image: kp.local/echo:e2e
      imagePullPolicy: Never
      args: ["-name", "client", "-listen", ":9000"]
`

const (
	kpImage  = "kp.local/kp:e2e"
	kpImage2 = "kp.local/kp:e2e-2"
)

func TestKpOnRealNodes(t *testing.T) {
	// Teardown's duration, for docs/cluster.md: the first cleanup registered
	// runs last.
	var teardown time.Time
	t.Cleanup(func() { t.Logf("cluster torn down in %v", time.Since(teardown).Round(100*time.Millisecond)) })
	start := time.Now()
	kpBin, err := netns.BuildStatic("./cmd/kp")
	if err != nil {
		t.Fatal(err)
	}
	echo, err := cluster.EchoImage()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kp and echo built in %v", time.Since(start).Round(100*time.Millisecond))
	c := cluster.Start(t, cluster.Options{Nodes: 2, Images: []image.Image{
		echo, cluster.KPImage(t, kpBin, kpImage), cluster.KPImage(t, kpBin, kpImage2),
	}})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	// The chart's renderer (Helm's Go module), for the last subtest: built
	// while the subtests before it run.
	go cluster.KPChartBuild()
	t.Cleanup(func() {
		if t.Failed() {
			dumpKP(t, c)
		}
		teardown = time.Now()
	})

	start = time.Now()
	if out, err := c.Kubectl("apply", "-k", kpOverlay(t, c, "e2e")); err != nil {
		t.Fatalf("kubectl apply -k (manifests/ with the test's image and addresses): %v\n%s", err, out)
	}
	waitKP(t, c, kpImage)
	t.Logf("kp Ready on every node %v after kubectl apply -k", time.Since(start).Round(100*time.Millisecond))

	start = time.Now()
	apply(t, c, workload)
	waitFor(t, "Deployment web to have 2 ready pods and pod client to run", 3*time.Minute, func() string {
		if s := webReady(t, c, 2); s != "" {
			return s
		}
		return podReady(t, c, "client")
	})
	t.Logf("workload ready %v after kubectl apply", time.Since(start).Round(100*time.Millisecond))
	client, err := c.Client().CoreV1().Pods("default").Get(ctx(t), "client", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	clientNS, err := n2.PodNetns(netip.MustParseAddr(client.Status.PodIP))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := c.Client().CoreV1().Services("default").Get(ctx(t), "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	np, err := c.Client().CoreV1().Services("default").Get(ctx(t), "web-np", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	clusterIP := netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), 80).String()
	nodePort := func(n *cluster.Node) string {
		return netip.AddrPortFrom(n.IP, uint16(np.Spec.Ports[0].NodePort)).String()
	}
	fromClient := func(addr string) func() (string, error) {
		return func() (string, error) { return cluster.DialFrom(clientNS, "tcp", addr, 5*time.Second) }
	}

	t.Run("kp pods are ready, pass their probes and log no error", func(t *testing.T) { checkKPPods(t, c) })

	t.Run("a Service answers from a pod on the other node and from the nodes", func(t *testing.T) {
		checkServiceAnswers(t, c, fromClient, clusterIP, nodePort)
	})

	t.Run("scaling the Deployment up and down is followed", func(t *testing.T) {
		if out, err := c.Kubectl("scale", "deployment", "web", "--replicas=4"); err != nil {
			t.Fatalf("kubectl scale: %v\n%s", err, out)
		}
		waitFor(t, "Deployment web to have 4 ready pods", 2*time.Minute, func() string { return webReady(t, c, 4) })
		four := podNames(webPods(t, c))
		seen(t, "the 4 pods through the ClusterIP from pod client", fromClient(clusterIP), four)

		if out, err := c.Kubectl("scale", "deployment", "web", "--replicas=2"); err != nil {
			t.Fatalf("kubectl scale: %v\n%s", err, out)
		}
		waitFor(t, "Deployment web to be back to 2 pods", 2*time.Minute, func() string { return webReady(t, c, 2) })
		two := podNames(webPods(t, c))
		waitFor(t, "kp on node-2 to program only the 2 remaining endpoints", time.Minute, func() string {
			return usableEndpoints(t, n2, 2)
		})
		answered := map[string]int{}
		for i := 0; i < 40; i++ {
			reply, err := fromClient(clusterIP)()
			if err != nil {
				t.Errorf("connection %d after scaling down: %v", i, err)
				continue
			}
			name, _, _ := strings.Cut(reply, " ")
			answered[name]++
		}
		for name := range answered {
			if !slices.Contains(two, name) {
				t.Errorf("pod %s, removed by scaling down, still answers: %v (remaining %v)", name, answered, two)
			}
		}
	})

	t.Run("a pod deleted mid-traffic costs no new connection once its endpoint is gone", func(t *testing.T) {
		pods := spreadWeb(t, c)
		var victim v1.Pod
		for _, p := range pods {
			if p.Spec.NodeName == n1.Name {
				victim = p
			}
		}
		if victim.Name == "" {
			t.Fatalf("no web pod on node-1: %v", podsOnNodes(pods))
		}
		loop := connLoop(fromPodNS(clientNS), clusterIP, nil)
		time.Sleep(2 * time.Second)
		if err := c.Client().CoreV1().Pods("default").Delete(ctx(t), victim.Name, metav1.DeleteOptions{}); err != nil {
			loop.Stop()
			t.Fatal(err)
		}
		deleted := time.Now()
		var programmed time.Time
		waitFor(t, "kp on node-2 to stop sending to deleted pod "+victim.Name, time.Minute, func() string {
			s := endpointUsable(t, n2, victim.Status.PodIP)
			if s == "" {
				programmed = time.Now()
			}
			return s
		})
		// An attempt in flight when the removal was programmed (one dialing
		// the pod going away) delays the loop, not the count.
		for end := time.Now().Add(30 * time.Second); len(netns.Since(loop.Attempts(), programmed)) < 20 && time.Now().Before(end); {
			time.Sleep(100 * time.Millisecond)
		}
		all := loop.Stop()
		after := all.Since(programmed)
		t.Logf("endpoint removal programmed %v after the delete; in all: %s; after it: %s",
			programmed.Sub(deleted).Round(10*time.Millisecond), all, after)
		if err := after.Err(); err != nil {
			t.Errorf("after the endpoint removal was programmed: %v", err)
		}
		for _, a := range after.Attempts {
			if name, _ := netns.ParseReply(a.Reply); name == victim.Name {
				t.Errorf("deleted pod %s answered at %s, after its endpoint removal was programmed", victim.Name, a.At.Format("15:04:05.000"))
			}
		}
		if len(after.Attempts) < 10 {
			t.Errorf("only %d connections after the removal: the loop did not run", len(after.Attempts))
		}
		waitFor(t, "Deployment web to replace the deleted pod", 2*time.Minute, func() string { return webReady(t, c, 2) })
	})

	t.Run("kp flows in a kp pod lists the client's flows", func(t *testing.T) {
		for i := 0; i < 5; i++ {
			if _, err := fromClient(clusterIP)(); err != nil {
				t.Fatalf("connection from pod client: %v", err)
			}
		}
		kp := kpPodOn(t, c, n2.Name)
		out, err := c.Kubectl("exec", "-n", "kube-system", kp, "--", "kp", "flows", "-n", "default")
		if err != nil {
			t.Fatalf("kubectl exec %s -- kp flows: %v\n%s", kp, err, out)
		}
		var found bool
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "default/web ") && strings.Contains(l, client.Status.PodIP) {
				found = true
			}
		}
		if !found {
			t.Errorf("kp flows on node-2 lists no flow of default/web from pod client (%s):\n%s", client.Status.PodIP, out)
		}
		if out, err := c.Kubectl("exec", "-n", "kube-system", kp, "--", "kp-top", "--help"); err != nil || !strings.Contains(out, "Usage") {
			t.Errorf("kubectl exec %s -- kp-top --help: %v\n%s", kp, err, out)
		}
	})

	t.Run("kp top runs in a kp pod through kubectl exec -it and shows the Service", func(t *testing.T) {
		netns.Require(t, "tmux")
		loop := connLoop(fromPodNS(clientNS), clusterIP, nil)
		defer loop.Stop()
		kp := kpPodOn(t, c, n2.Name)
		argv := c.KubectlCommand("exec", "-it", "-n", "kube-system", kp, "--", "kp-top", "--refresh", "1s")
		tm := tmux.Start(t, 120, 30, strings.Join(argv, " "))
		var screen string
		waitFor(t, "kp top in pod "+kp+" to show Service default/web", time.Minute, func() string {
			screen = tm.Screen()
			if strings.Contains(screen, "[exited") {
				t.Fatalf("kubectl exec -it %s -- kp-top exited:\n%s", kp, screen)
			}
			if strings.Contains(screen, "web") && strings.Contains(screen, "default") {
				return ""
			}
			return "screen:\n" + screen
		})
		tm.Keys("q")
		waitFor(t, "kp top to quit on q", 30*time.Second, func() string {
			screen = tm.Screen()
			if strings.Contains(screen, "[exited 0]") {
				return ""
			}
			return "screen:\n" + screen
		})
	})

	t.Run("cluster DNS answers through its ClusterIP and a replaced DNS pod loses no query", func(t *testing.T) {
		testClusterDNS(t, c, clientNS)
	})

	t.Run("a rolling update of kp loses no connection", func(t *testing.T) {
		// A failed attempt carries each node's unestablished conntrack
		// entries, taken at once (a known flake: see docs/known-flakes.md).
		viaClusterIP := connLoop(fromPodNS(clientNS), clusterIP, onNodes(c))
		viaNodePort := connLoop(fromNode(n1), nodePort(n2), onNodes(c))
		time.Sleep(2 * time.Second)
		start := time.Now()
		if out, err := c.Kubectl("apply", "-k", kpOverlay(t, c, "e2e-2")); err != nil {
			viaClusterIP.Stop()
			viaNodePort.Stop()
			t.Fatalf("kubectl apply -k with image tag e2e-2: %v\n%s", err, out)
		}
		waitKP(t, c, kpImage2)
		t.Logf("DaemonSet kp rolled over %d nodes in %v", len(c.Nodes), time.Since(start).Round(100*time.Millisecond))
		time.Sleep(2 * time.Second)
		for name, l := range map[string]*netns.Loop{
			"pod client on node-2 to ClusterIP " + clusterIP: viaClusterIP,
			"node-1 to NodePort " + nodePort(n2):             viaNodePort,
		} {
			s := l.Stop()
			t.Logf("%s: %s", name, s)
			if err := s.Err(); err != nil {
				t.Errorf("%s, during the rolling update: %v", name, err)
			}
		}
	})

	t.Run("the Helm chart, installed as the README says, takes over the DaemonSet and Services answer", func(t *testing.T) {
		// The README's helm install with this cluster's values, rendered
		// through Helm's Go module and applied, over what kubectl apply -k
		// applied: its objects are manifests/' own, so the DaemonSet rolls
		// to the chart's image tag (the one it does not run now) and
		// nothing else changes.
		start := time.Now()
		tag, image := "e2e", kpImage
		if ds, err := c.Client().AppsV1().DaemonSets("kube-system").Get(ctx(t), "kp", metav1.GetOptions{}); err == nil &&
			ds.Spec.Template.Spec.Containers[0].Image == kpImage {
			tag, image = "e2e-2", kpImage2
		}
		manifest, err := c.KPChart(tag)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("chart rendered %v after the subtest's start (kp-chart built in the background)", time.Since(start).Round(100*time.Millisecond))
		if out, err := c.Kubectl("apply", "-f", manifest); err != nil {
			t.Fatalf("kubectl apply -f (charts/kp, the README's helm install with the test's values): %v\n%s", err, out)
		}
		waitKP(t, c, image)
		t.Logf("the chart's kp Ready on every node %v after the subtest's start", time.Since(start).Round(100*time.Millisecond))
		checkKPPods(t, c)
		spreadWeb(t, c)
		checkServiceAnswers(t, c, fromClient, clusterIP, nodePort)
	})
}

// klogLine matches a klog text line of a severity (I, W, E).
func klogLine(severity string) *regexp.Regexp {
	return regexp.MustCompile(`(?m)^` + severity + `\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ [^ ]+:\d+\] "`)
}

// checkKPPods checks that every kp pod is ready without a restart, logs
// at INFO and never at ERROR, found the sysctls set by its init container,
// which set upstream's conntrack timeouts in the node's namespace.
func checkKPPods(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	pods := kpPods(t, c)
	for _, p := range pods {
		for _, cs := range p.Status.ContainerStatuses {
			if !cs.Ready || cs.RestartCount != 0 {
				t.Errorf("kp pod %s on %s: ready %v, restarts %d", p.Name, p.Spec.NodeName, cs.Ready, cs.RestartCount)
			}
		}
		logs, err := c.Kubectl("logs", "-n", "kube-system", p.Name)
		if err != nil {
			t.Errorf("kubectl logs %s: %v\n%s", p.Name, err, logs)
		}
		// The check below means something only if kp logs levels:
		// klog's text, an I, W or E before the date.
		if !klogLine("I").MatchString(logs) {
			t.Errorf("kp pod %s logged no INFO line; its logs:\n%s", p.Name, logs)
		}
		for _, l := range strings.Split(logs, "\n") {
			if klogLine("E").MatchString(l) {
				t.Errorf("kp pod %s on %s logged an error: %s", p.Name, p.Spec.NodeName, l)
			}
			// The init container set the sysctls; kp, without a
			// writable /proc/sys, finds them in force.
			if strings.Contains(l, "conntrack sysctl") {
				t.Errorf("kp pod %s on %s: the proxy container had a sysctl to set: %s", p.Name, p.Spec.NodeName, l)
			}
		}
		// The privileged init container (kp sysctl) set upstream's
		// conntrack timeouts in the node's namespace.
		initLogs, err := c.Kubectl("logs", "-n", "kube-system", p.Name, "-c", "sysctl")
		if err != nil {
			t.Errorf("kubectl logs %s -c sysctl: %v\n%s", p.Name, err, initLogs)
		}
		if got, err := c.Node(p.Spec.NodeName).Exec("cat", "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait"); err != nil ||
			strings.TrimSpace(got) != "3600" {
			t.Errorf("node %s: nf_conntrack_tcp_timeout_close_wait %q (%v), want 3600 from the init container; its logs:\n%s",
				p.Spec.NodeName, got, err, initLogs)
		}
	}
}

// checkServiceAnswers checks that Service web answers with both its pods,
// one on each node: through its ClusterIP and node-1's NodePort from pod
// client on node-2, and from each node through the ClusterIP and the
// other node's NodePort.
func checkServiceAnswers(t *testing.T, c *cluster.Cluster, fromClient func(addr string) func() (string, error), clusterIP string,
	nodePort func(n *cluster.Node) string) {
	t.Helper()
	n1, n2 := c.Nodes[0], c.Nodes[1]
	want := webPods(t, c)
	if len(want) != 2 || want[0].Spec.NodeName == want[1].Spec.NodeName {
		t.Fatalf("web pods not one per node: %v", podsOnNodes(want))
	}
	names := podNames(want)
	// From the client pod on node-2, the ClusterIP reaches both, one of
	// them on node-1 (pod to pod across nodes, through kp's DNAT).
	seen(t, "ClusterIP "+clusterIP+" from pod client on node-2", fromClient(clusterIP), names)
	seen(t, "NodePort of node-1 from pod client on node-2", fromClient(nodePort(n1)), names)
	for _, n := range c.Nodes {
		seen(t, "ClusterIP from "+n.Name+" itself", func() (string, error) {
			return n.Dial("tcp", clusterIP, 5*time.Second)
		}, names)
		other := n1
		if n == n1 {
			other = n2
		}
		seen(t, "NodePort of "+other.Name+" from "+n.Name, func() (string, error) {
			return n.Dial("tcp", nodePort(other), 5*time.Second)
		}, names)
	}
}
