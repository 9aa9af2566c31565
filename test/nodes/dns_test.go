package nodes

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/kpproxy/kp/test/cluster"
)

// testClusterDNS runs a real cluster DNS and a resolver in pod client (on
// node-2, clientNS) that keeps one UDP socket, as resolvers do: it must get
// answers through the kube-dns ClusterIP, and keep getting them when the
// DNS pod is replaced. Without kp's conntrack cleanup the resolver's flow
// would stay pinned to the old pod's address (its packets keep the
// conntrack entry alive) and every query after that pod is gone would be
// lost.
func testClusterDNS(t *testing.T, c *cluster.Cluster, clientNS string) {
	// On node-1, so that node-2's pods reach it across nodes.
	dnsAddr := cluster.DeployDNS(t, c, cluster.DNSOptions{Node: "node-1", Timeout: 2 * time.Minute})

	web, err := c.Client().CoreV1().Services("default").Get(ctx(t), "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := netip.MustParseAddr(web.Spec.ClusterIP)
	server := net.JoinHostPort(dnsAddr, "53")
	conn, err := cluster.DialConnFrom(ctx(t), clientNS, "udp", server)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := &resolver{conn: conn}
	const name = "web.default.svc.cluster.local."
	waitFor(t, "an answer for "+name+" from "+server, time.Minute, func() string {
		got, err := r.lookup(name)
		if err != nil {
			return err.Error()
		}
		if got != want {
			return fmt.Sprintf("answer %v, want web's ClusterIP %v", got, want)
		}
		return ""
	})

	old := podsOf(t, c, "kube-system", "k8s-app=kube-dns")
	if len(old) != 1 {
		t.Fatalf("CoreDNS pods: %v", podNames(old))
	}
	queries := startLoop(func() (string, error) {
		got, err := r.lookup(name)
		if err == nil && got != want {
			err = fmt.Errorf("answer %v, want %v", got, want)
		}
		return "", err
	})
	defer queries.Stop()
	time.Sleep(time.Second)
	if err := c.Client().CoreV1().Pods("kube-system").Delete(ctx(t), old[0].Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The old pod serves until its lameduck ends; the stale flow would
	// fail from when it is gone. Judge the queries from then on, once kp
	// on node-2 sends kube-dns to the new pod alone.
	waitFor(t, "the old CoreDNS pod "+old[0].Name+" to be gone", 2*time.Minute, func() string {
		if _, err := c.Client().CoreV1().Pods("kube-system").Get(ctx(t), old[0].Name, metav1.GetOptions{}); err == nil {
			return "still there"
		}
		return ""
	})
	waitFor(t, "kp on node-2 to send kube-dns to the new pod only", time.Minute, func() string {
		pods := podsOf(t, c, "kube-system", "k8s-app=kube-dns")
		if len(pods) != 1 {
			return fmt.Sprintf("ready CoreDNS pods %v", podNames(pods))
		}
		s, err := kpServices(c.Nodes[1], "kube-system", "kube-dns")
		if err != nil {
			return err.Error()
		}
		usable := usableIPs(s)
		if len(usable) != len(s.ServicePorts) || slices.ContainsFunc(usable, func(ip string) bool { return ip != pods[0].Status.PodIP }) {
			return fmt.Sprintf("usable endpoints %v of %d ports; new pod %s", usable, len(s.ServicePorts), pods[0].Status.PodIP)
		}
		return ""
	})
	gone := time.Now()
	queries.WaitSince(gone, 50, time.Minute)
	as := queries.Stop()
	after := since(as, gone)
	t.Logf("%d queries, %d failed; %d after the old pod was gone and kp sent kube-dns to the new one",
		len(as), len(failures(as)), len(after))
	if f := failures(after); len(f) > 0 {
		t.Errorf("%d of %d queries on one UDP socket were lost after the DNS pod was replaced:\n%s",
			len(f), len(after), strings.Join(f, "\n"))
	}
	if len(after) < 50 {
		t.Errorf("only %d queries after the replacement: the resolver loop did not run", len(after))
	}
}

// resolver asks A questions over one connected UDP socket, so every query
// leaves from the same address and port, as a pod's resolver library does.
type resolver struct {
	conn net.Conn
	id   uint16
}

// lookup asks for name's A record and returns the first address of the
// answer; a query without an answer within a second is lost.
func (r *resolver) lookup(name string) (netip.Addr, error) {
	r.id++
	q, err := (&dnsmessage.Message{
		Header: dnsmessage.Header{ID: r.id, RecursionDesired: true},
		Questions: []dnsmessage.Question{{
			Name: dnsmessage.MustNewName(name), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET,
		}},
	}).Pack()
	if err != nil {
		return netip.Addr{}, err
	}
	_ = r.conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := r.conn.Write(q); err != nil {
		return netip.Addr{}, err
	}
	buf := make([]byte, 1500)
	for {
		n, err := r.conn.Read(buf)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("query %d for %s: %w", r.id, name, err)
		}
		var m dnsmessage.Message
		if err := m.Unpack(buf[:n]); err != nil {
			return netip.Addr{}, fmt.Errorf("query %d: reply: %w", r.id, err)
		}
		if m.ID != r.id {
			continue // a late answer to an earlier query
		}
		if m.RCode != dnsmessage.RCodeSuccess {
			return netip.Addr{}, fmt.Errorf("query %d for %s: %v", r.id, name, m.RCode)
		}
		for _, a := range m.Answers {
			if rec, ok := a.Body.(*dnsmessage.AResource); ok {
				return netip.AddrFrom4(rec.A), nil
			}
		}
		return netip.Addr{}, fmt.Errorf("query %d for %s: no A record in the answer", r.id, name)
	}
}
