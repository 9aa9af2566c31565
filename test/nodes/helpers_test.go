package nodes

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpproxy/kp/proxy/statusapi"
	"github.com/kpproxy/kp/test/cluster"
	"github.com/kpproxy/kp/test/netns"
)

// waitFor polls cond every 250 ms until it returns "" (done) and fails the
// test after timeout with what was awaited and cond's last answer.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	start := time.Now()
	for {
		last := cond()
		if last == "" {
			t.Logf("%s: after %v", what, time.Since(start).Round(100*time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s; still: %s", timeout, what, last)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// apply writes manifest to a file and kubectl applies it. The file is
// not in t.TempDir(): a subtest's name may hold a comma, and kubectl -f
// takes a comma as a list of paths.
func apply(t *testing.T, c *cluster.Cluster, manifest string) {
	t.Helper()
	tmp, err := os.CreateTemp("", "kp-test-manifest-*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	f := tmp.Name()
	t.Cleanup(func() { os.Remove(f) })
	if _, err := tmp.WriteString(manifest); err != nil {
		t.Fatal(err)
	}
	if err := tmp.Close(); err != nil {
		t.Fatal(err)
	}
	if out, err := c.Kubectl("apply", "-f", f); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
}

// kpOverlay writes the kustomization of manifests/ with the test's image
// and addresses (see cluster.KPOverlay) and returns its folder.
func kpOverlay(t *testing.T, c *cluster.Cluster, imageTag string, opts ...cluster.KPOption) string {
	t.Helper()
	dir, err := c.KPOverlay(imageTag, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// attempt is one query of a clientLoop.
type attempt struct {
	at    time.Time
	reply string // the first word of the answer, when there was one
	err   error
}

// clientLoop asks with a query function, one query after the other,
// until stopped: the DNS test's queries. (New TCP connections go through
// connLoop, which also bounds each one's latency.)
type clientLoop struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	log  []attempt
}

// startLoop dials with dial every 50 ms; it stops by itself after 10
// minutes whatever happens.
func startLoop(dial func() (string, error)) *clientLoop {
	l := &clientLoop{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		end := time.After(10 * time.Minute)
		for {
			at := time.Now()
			reply, err := dial()
			name, _, _ := strings.Cut(reply, " ")
			l.mu.Lock()
			l.log = append(l.log, attempt{at: at, reply: name, err: err})
			l.mu.Unlock()
			select {
			case <-l.stop:
				return
			case <-end:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return l
}

// Stop ends the loop and returns every attempt.
func (l *clientLoop) Stop() []attempt {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	<-l.done
	return l.attempts()
}

// WaitSince waits until n attempts that started at or after t have ended,
// or timeout passes. An attempt in flight at t (one dialing a pod that is
// going away, until its timeout) delays the loop, not the count.
func (l *clientLoop) WaitSince(t time.Time, n int, timeout time.Duration) {
	end := time.Now().Add(timeout)
	for len(since(l.attempts(), t)) < n && time.Now().Before(end) {
		time.Sleep(100 * time.Millisecond)
	}
}

func (l *clientLoop) attempts() []attempt {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]attempt(nil), l.log...)
}

// since returns the attempts started at or after t.
func since(as []attempt, t time.Time) []attempt {
	var out []attempt
	for _, a := range as {
		if !a.at.Before(t) {
			out = append(out, a)
		}
	}
	return out
}

// onNodes is a connection loop's LoopSpec.Explain: every node's TCP
// conntrack entries that are not established or closing, listed right
// after a failed or slow attempt (they expire long before the test ends),
// to tell where its SYNs went and which NAT they met, and kp's last sync.
func onNodes(c *cluster.Cluster) func() string {
	return func() string {
		var b strings.Builder
		for _, n := range c.Nodes {
			// CLOSE is kept: a connection reset by its peer (a RST from an
			// endpoint or a node) leaves its entry there.
			out, _ := n.Exec("sh", "-c", "conntrack -L -p tcp 2>/dev/null | grep -Ev 'ESTABLISHED|TIME_WAIT|FIN_WAIT|LAST_ACK|CLOSE_WAIT'")
			fmt.Fprintf(&b, "\n    %s, conntrack entries not established: %s", n.Name, strings.TrimSpace(out))
			fmt.Fprintf(&b, "\n    %s, kp: %s", n.Name, kpSyncs(n))
			// "no route to host" is a neighbour that did not answer (or an
			// ICMP host unreachable): the unresolved ones.
			out, _ = n.Exec("sh", "-c", "ip -4 neigh | grep -Ev 'REACHABLE|STALE|PERMANENT|DELAY'")
			fmt.Fprintf(&b, "\n    %s, neighbours unresolved: %s", n.Name, strings.TrimSpace(out))
		}
		return b.String()
	}
}

// connLoop starts a netns.Loop of new TCP connections to addr, one every
// 50 ms, opened by dial (from a pod's or a node's namespace): each must be
// answered within netns.SlowConnect (a lost SYN, sent again after 1 s,
// fails it); the 5 s timeout only lets a slow one be measured. explain,
// when set, is the loop's LoopSpec.Explain.
func connLoop(dial func(ctx context.Context, network, addr string) (net.Conn, error), addr string, explain func() string) *netns.Loop {
	return netns.StartLoop(netns.LoopSpec{Dial: dial, Addrs: []string{addr}, Timeout: 5 * time.Second,
		Pause: 50 * time.Millisecond, Explain: explain})
}

// fromPodNS and fromNode dial from a pod's network namespace file (see
// cluster.Node.PodNetns) and from a node's own namespace, for connLoop.
func fromPodNS(nsPath string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return cluster.DialConnFrom(ctx, nsPath, network, addr)
	}
}

func fromNode(n *cluster.Node) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return netns.DialConn(ctx, n.NS, network, addr)
	}
}

// kpSyncs says what kp on n runs and when it last synced, for a failed
// attempt's message: a sync that ended just before the failure points at
// kp's own rules.
func kpSyncs(n *cluster.Node) string {
	st, err := kpStatus(n)
	if err != nil {
		return err.Error()
	}
	last := "never"
	if st.LastSync != nil {
		last = fmt.Sprintf("%s (full %v, generation %d)", st.LastSync.Time.Format("15:04:05.000"), st.LastSync.Full, st.LastSync.Generation)
	}
	return fmt.Sprintf("%s, started %s, last sync %s, syncs %+v", st.Mode, st.StartTime.Format("15:04:05.000"), last, st.Syncs)
}

// kpStatus reads kp's status API on n, through its socket (root's).
func kpStatus(n *cluster.Node) (*statusapi.Status, error) {
	socket, err := n.KPStatusSocket()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	st, err := statusapi.SocketClient(socket).Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: kp's status: %w", n.Name, err)
	}
	return st, nil
}

// failures lists the failed attempts, for a message.
func failures(as []attempt) []string {
	var out []string
	for _, a := range as {
		if a.err != nil {
			out = append(out, fmt.Sprintf("%s: %v", a.at.Format("15:04:05.000"), a.err))
		}
	}
	return out
}

// ctx is a context for one API call.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

var _ = metav1.Now
