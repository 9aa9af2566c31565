package nodes

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpproxy/kp/proxy/statusapi"
	"github.com/kpproxy/kp/test/cluster"
)

// What the tests read of the cluster: kp's pods and status API, the
// workload's pods.

// waitKP waits until the DaemonSet runs one Ready kp pod of image on every
// node and no other (cluster.WaitKP).
func waitKP(t *testing.T, c *cluster.Cluster, image string) {
	t.Helper()
	start := time.Now()
	if err := c.WaitKP(image, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("a Ready kp pod with image %s on every node: after %v", image, time.Since(start).Round(100*time.Millisecond))
}

func kpPods(t *testing.T, c *cluster.Cluster) []v1.Pod {
	t.Helper()
	pods, err := c.Client().CoreV1().Pods("kube-system").List(ctx(t), metav1.ListOptions{LabelSelector: "k8s-app=kp"})
	if err != nil {
		t.Fatal(err)
	}
	return pods.Items
}

func kpPodOn(t *testing.T, c *cluster.Cluster, node string) string {
	t.Helper()
	for _, p := range kpPods(t, c) {
		if p.Spec.NodeName == node && p.DeletionTimestamp == nil {
			return p.Name
		}
	}
	t.Fatalf("no kp pod on %s", node)
	return ""
}

// webPods lists the web pods that are Ready and not terminating.
func webPods(t *testing.T, c *cluster.Cluster) []v1.Pod { return podsOf(t, c, "default", "app=web") }

// podsOf lists the pods of namespace ns matching selector that are Ready and
// not terminating.
func podsOf(t *testing.T, c *cluster.Cluster, ns, selector string) []v1.Pod {
	t.Helper()
	pods, err := c.Client().CoreV1().Pods(ns).List(ctx(t), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	var out []v1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && cluster.PodReady(&p) {
			out = append(out, p)
		}
	}
	return out
}

// webReady says how far web is from n Ready pods and no other ("" when
// there).
func webReady(t *testing.T, c *cluster.Cluster, n int) string {
	return podsReady(t, c, "default", "app=web", n)
}

// podsReady says how far the pods of namespace ns matching selector are
// from n Ready pods and no other ("" when there).
func podsReady(t *testing.T, c *cluster.Cluster, ns, selector string, n int) string {
	pods, err := c.Client().CoreV1().Pods(ns).List(ctx(t), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return err.Error()
	}
	ready := 0
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && cluster.PodReady(&p) {
			ready++
		}
	}
	if ready == n && len(pods.Items) == n {
		return ""
	}
	return fmt.Sprintf("%d pods, %d ready: %v", len(pods.Items), ready, podsOnNodes(pods.Items))
}

func podReady(t *testing.T, c *cluster.Cluster, name string) string {
	p, err := c.Client().CoreV1().Pods("default").Get(ctx(t), name, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	if !cluster.PodReady(p) {
		return fmt.Sprintf("pod %s: %s, not ready", name, p.Status.Phase)
	}
	return ""
}

func podNames(pods []v1.Pod) []string {
	var names []string
	for _, p := range pods {
		names = append(names, p.Name)
	}
	sort.Strings(names)
	return names
}

func podsOnNodes(pods []v1.Pod) []string {
	var s []string
	for _, p := range pods {
		s = append(s, fmt.Sprintf("%s@%s(%s,%s)", p.Name, p.Spec.NodeName, p.Status.PodIP, p.Status.Phase))
	}
	return s
}

// seen dials until every one of want has answered (and nothing else has),
// failing the test after a minute.
func seen(t *testing.T, what string, dial func() (string, error), want []string) {
	t.Helper()
	got := map[string]bool{}
	var lastErr error
	waitFor(t, what+" to be answered by each of "+strings.Join(want, ", "), time.Minute, func() string {
		for i := 0; i < 10; i++ {
			reply, err := dial()
			if err != nil {
				lastErr = err
				continue
			}
			name, _, _ := strings.Cut(reply, " ")
			if !slices.Contains(want, name) {
				t.Errorf("%s: answered by %q, not one of %v", what, name, want)
			}
			got[name] = true
		}
		var missing []string
		for _, w := range want {
			if !got[w] {
				missing = append(missing, w)
			}
		}
		if len(missing) == 0 {
			return ""
		}
		return fmt.Sprintf("no answer yet from %v (last error: %v)", missing, lastErr)
	})
}

// kpServices reads a Service from the status API of kp on node n (on its
// socket, in the kp pod's emptyDir).
func kpServices(n *cluster.Node, namespace, service string) (*statusapi.Services, error) {
	socket, err := n.KPStatusSocket()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return statusapi.SocketClient(socket).Services(ctx, namespace, service)
}

// usableEndpoints says how far kp on n is from sending web's traffic to
// exactly want endpoints.
func usableEndpoints(t *testing.T, n *cluster.Node, want int) string {
	s, err := kpServices(n, "default", "web")
	if err != nil {
		return err.Error()
	}
	usable := usableIPs(s)
	if len(usable) == want {
		return ""
	}
	return fmt.Sprintf("usable endpoints %v", usable)
}

// usableIPs lists the endpoints kp sends new connections to, one entry per
// service port and endpoint.
func usableIPs(s *statusapi.Services) []string {
	var usable []string
	for _, sp := range s.ServicePorts {
		for _, ep := range sp.Endpoints {
			if ep.Usable {
				usable = append(usable, ep.IP)
			}
		}
	}
	return usable
}

// endpointUsable says whether kp on n still sends web's traffic to ip (""
// when it does not).
func endpointUsable(t *testing.T, n *cluster.Node, ip string) string {
	s, err := kpServices(n, "default", "web")
	if err != nil {
		return err.Error()
	}
	for _, sp := range s.ServicePorts {
		for _, ep := range sp.Endpoints {
			if ep.IP == ip && ep.Usable {
				return fmt.Sprintf("endpoint %s usable (ready %v, terminating %v)", ip, ep.Ready, ep.Terminating)
			}
		}
	}
	return ""
}

// dumpKP logs the kp pods' logs and descriptions, for a failure.
func dumpKP(t *testing.T, c *cluster.Cluster) {
	pods, err := c.Client().CoreV1().Pods("kube-system").List(ctx(t), metav1.ListOptions{LabelSelector: "k8s-app=kp"})
	if err != nil {
		t.Logf("kp pods: %v", err)
		return
	}
	for _, p := range pods.Items {
		logs, _ := c.Kubectl("logs", "-n", "kube-system", p.Name, "--tail=60")
		desc, _ := c.Kubectl("describe", "pod", "-n", "kube-system", p.Name)
		t.Logf("--- kp pod %s on %s ---\n%s\n--- logs ---\n%s", p.Name, p.Spec.NodeName, desc, logs)
	}
}

// spreadWeb returns the 2 web pods one per node. Scaling down keeps the
// pods the ReplicaSet ranks last, which may be both on one node (a CI run
// kept both on node-2); the spread constraint only acts when scheduling, so
// deleting one of the pair puts its replacement on the empty node.
func spreadWeb(t *testing.T, c *cluster.Cluster) []v1.Pod {
	t.Helper()
	pods := webPods(t, c)
	if len(pods) == 2 && pods[0].Spec.NodeName == pods[1].Spec.NodeName {
		t.Logf("web pods both on %s after scaling down; deleting %s so its replacement lands on the other node", pods[0].Spec.NodeName, pods[0].Name)
		if err := c.Client().CoreV1().Pods("default").Delete(ctx(t), pods[0].Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "web pods to be one per node", 2*time.Minute, func() string {
			if s := webReady(t, c, 2); s != "" {
				return s
			}
			pods = webPods(t, c)
			if len(pods) != 2 || pods[0].Spec.NodeName == pods[1].Spec.NodeName {
				return fmt.Sprint(podsOnNodes(pods))
			}
			return ""
		})
	}
	return pods
}
