package nodes

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpproxy/kp/test/cluster"
	"github.com/kpproxy/kp/test/netns"
)

// streamService is a Service without selector whose one endpoint is a
// server the test runs in node-1's namespace (its address, port 9100): the
// far end of the long-lived connection.
func streamService(nodeIP netip.Addr) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata:
  name: stream
  namespace: default
spec:
  ports:
    - port: 9100
      targetPort: 9100
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: stream-1
  namespace: default
  labels:
    kubernetes.io/service-name: stream
    endpointslice.kubernetes.io/managed-by: kp-test
addressType: IPv4
ports:
  - port: 9100
    protocol: TCP
endpoints:
  - addresses: ["%s"]
    conditions: {ready: true}
`, nodeIP)
}

// lineServer answers every line with "stream LINE" until the test ends.
func lineServer(t *testing.T, ns string, addr string) {
	t.Helper()
	netns.Serve(t, ns, addr, func(c net.Conn) {
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if _, err := fmt.Fprintf(c, "stream %s", line); err != nil {
				return
			}
		}
	})
}

// longLived is one TCP connection that exchanges a line every 200 ms
// until stopped; the first failure ends it.
type longLived struct {
	stop      chan struct{}
	done      chan struct{}
	exchanges int
	err       error
}

func startLongLived(t *testing.T, nsPath, addr string) *longLived {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cluster.DialConnFrom(ctx, nsPath, "tcp", addr)
	if err != nil {
		t.Fatalf("long-lived connection to %s: %v", addr, err)
	}
	l := &longLived{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		defer c.Close()
		r := bufio.NewReader(c)
		for i := 0; ; i++ {
			select {
			case <-l.stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			want := fmt.Sprintf("ping %d\n", i)
			if _, err := c.Write([]byte(want)); err != nil {
				l.err = fmt.Errorf("exchange %d at %s: write: %w", i, time.Now().Format("15:04:05.000"), err)
				return
			}
			got, err := r.ReadString('\n')
			if err != nil || got != "stream "+want {
				l.err = fmt.Errorf("exchange %d at %s: read %q: %v", i, time.Now().Format("15:04:05.000"), got, err)
				return
			}
			l.exchanges++
		}
	}()
	return l
}

// Stop ends the connection's loop and returns how many exchanges it made
// and its failure.
func (l *longLived) Stop() (int, error) {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	<-l.done
	return l.exchanges, l.err
}

// kpMigrate runs the built kp binary's migrate cluster in the API server's
// namespace with the cluster's admin kubeconfig, as an operator runs it
// against a cluster; its lines are logged as they come, and returned.
func kpMigrate(t *testing.T, c *cluster.Cluster, kpBin string, args ...string) (string, error) {
	t.Helper()
	kubeconfig := c.API.Kubeconfig(0, c.API.AdminToken())
	argv := append([]string{"netns", "exec", c.API.NS(), kpBin, "migrate", "cluster", "--kubeconfig", kubeconfig}, args...)
	cmd := exec.Command("ip", argv...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var all strings.Builder
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		t.Logf("kp migrate cluster %s| %s", strings.Join(args, " "), sc.Text())
		all.WriteString(sc.Text() + "\n")
	}
	err = cmd.Wait()
	t.Logf("kp migrate cluster %s: %v after %v", strings.Join(args, " "), errOrOK(err), time.Since(start).Round(100*time.Millisecond))
	return all.String(), err
}

func errOrOK(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

// sample is what one look at a node showed.
type sample struct {
	at                  time.Time
	kubeProxyPod, kpPod bool // a pod of that DaemonSet on the node (any state)
	kubeChains          int  // kube-proxy's chains in the kernel
	kpTable             bool // kp's nftables table
}

// watcher samples every node every 300 ms: which proxy pods are there,
// which rules are in the kernel.
type watcher struct {
	stop    chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	samples map[string][]sample
}

func watchNodes(t *testing.T, c *cluster.Cluster) *watcher {
	w := &watcher{stop: make(chan struct{}), done: make(chan struct{}), samples: map[string][]sample{}}
	go func() {
		defer close(w.done)
		for {
			for _, n := range c.Nodes {
				s := sample{at: time.Now()}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				pods, err := c.Client().CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
				cancel()
				if err != nil {
					continue
				}
				for _, p := range pods.Items {
					s.kubeProxyPod = s.kubeProxyPod || p.Labels["k8s-app"] == "kube-proxy"
					s.kpPod = s.kpPod || p.Labels["k8s-app"] == "kp"
				}
				chains, err := kubeProxyChains(n)
				if err != nil {
					continue
				}
				s.kubeChains = len(chains)
				_, err = n.Exec("nft", "list", "table", "ip", "kp")
				s.kpTable = err == nil
				w.mu.Lock()
				w.samples[n.Name] = append(w.samples[n.Name], s)
				w.mu.Unlock()
			}
			select {
			case <-w.stop:
				return
			case <-time.After(300 * time.Millisecond):
			}
		}
	}()
	return w
}

func (w *watcher) Stop() map[string][]sample {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.samples
}
