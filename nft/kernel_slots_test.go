package nft

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables/expr"
	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
)

// Kernel tests of the endpoint slots: counts from real connections, and
// what a new connection meets and an endpoint change sends.

// TestKernelEndpointCountersCountRealConnections: every new connection
// through a Service moves its endpoint's counter (the element counter of the
// endpoint's slot, which the kernel updates on the DNAT rule's lookup), and
// a change to the Service's other endpoints leaves those counts alone.
func TestKernelEndpointCountersCountRealConnections(t *testing.T) {
	ns, fd := testNetns(t)
	// No cluster CIDR: no masquerade, which would need a route out of lo.
	b, err := NewInNamespace(proxy.Config{MasqueradeBit: 14}, nil, fd)
	if err != nil {
		t.Fatal(err)
	}
	loopbackEndpoints(t, ns, []string{"10.96.0.10", "10.244.1.2", "10.244.1.3"}, []string{"10.244.1.2:8080", "10.244.1.3:8080"})
	w := newWorld()
	web := statetest.PortName("demo", "web", "http", v1.ProtocolTCP)
	w.AddService(web, "10.96.0.10", 80, 0, "10.244.1.2:8080", "10.244.1.3:8080")
	st := w.Next()
	mustSync(t, b, st)

	const conns = 20
	dialN(t, ns, "10.96.0.10:80", conns)
	counters, err := b.EndpointCounters(st)
	if err != nil {
		t.Fatal(err)
	}
	ep := func(s string) proxy.EndpointRef {
		return proxy.EndpointRef{ServicePort: web, Endpoint: netip.MustParseAddrPort(s)}
	}
	a, c := counters[ep("10.244.1.2:8080")], counters[ep("10.244.1.3:8080")]
	if a.Packets+c.Packets != conns || a.Packets == 0 || c.Packets == 0 {
		t.Fatalf("counts after %d connections: %+v and %+v, want %d in all and some for each", conns, a, c, conns)
	}

	// A third endpoint: the choice of slot changes (mod 3), the first
	// two endpoints' elements do not, and neither do their counts.
	w.SetEndpoints(web, "10.244.1.2:8080", "10.244.1.3:8080", "10.244.1.4:8080")
	st = w.Next()
	mustSync(t, b, st)
	after, err := b.EndpointCounters(st)
	if err != nil {
		t.Fatal(err)
	}
	if after[ep("10.244.1.2:8080")] != a || after[ep("10.244.1.3:8080")] != c {
		t.Errorf("counts changed with another endpoint: %+v, was %+v and %+v", after, a, c)
	}
	if _, ok := after[ep("10.244.1.4:8080")]; !ok {
		t.Errorf("no count for the new endpoint: %+v", after)
	}
}

// TestKernelAffinityCountersSurviveAChangeToOtherEndpoints: a Service with
// ClientIP affinity keeps a DNAT rule per endpoint, whose counts kp carries
// into the rules that replace them.
func TestKernelAffinityCountersSurviveAChangeToOtherEndpoints(t *testing.T) {
	ns, _, b := kernelBackend(t)
	w := newWorld()
	web := statetest.PortName("demo", "web", "http", v1.ProtocolTCP)
	w.AddService(web, "10.96.0.10", 80, 0, "10.244.1.2:8080", "10.244.1.3:8080")
	w.Services[web].AffinityTimeout = 3 * time.Hour
	mustSync(t, b, w.Next())
	// Seven connections went to 10.244.1.2 (set by hand: the rule is
	// replaced with one whose counter starts there).
	chain := "svc-demo/web/tcp/http"
	listing := nftIn(t, ns, "-a", "list", "chain", "ip", TableName, chain)
	var handle, rule string
	for _, line := range strings.Split(listing, "\n") {
		if strings.Contains(line, "numgen random mod 2 0") && strings.Contains(line, "dnat to 10.244.1.2:8080") {
			rule, handle, _ = strings.Cut(line, " # handle ")
			rule, _, _ = strings.Cut(rule, " comment ")
		}
	}
	if handle == "" {
		t.Fatalf("no rule to 10.244.1.2 in:\n%s", listing)
	}
	rule = strings.Replace(strings.TrimSpace(rule), "counter packets 0 bytes 0", "counter packets 7 bytes 700", 1)
	nftIn(t, ns, append([]string{"replace", "rule", "ip", TableName, chain, "handle", strings.TrimSpace(handle)},
		strings.Fields(rule)...)...)

	w.SetEndpoints(web, "10.244.1.2:8080", "10.244.1.3:8080", "10.244.1.4:8080")
	st := w.Next()
	mustSync(t, b, st)
	if !strings.Contains(nftIn(t, ns, "list", "chain", "ip", TableName, chain), "counter packets 7 bytes 700") {
		t.Fatalf("the chain was not rewritten with the old count:\n%s", nftIn(t, ns, "list", "chain", "ip", TableName, chain))
	}
	counters, err := b.EndpointCounters(st)
	if err != nil {
		t.Fatal(err)
	}
	got := counters[proxy.EndpointRef{ServicePort: web, Endpoint: netip.MustParseAddrPort("10.244.1.2:8080")}]
	if got.Packets != 7 || got.Bytes != 700 {
		t.Errorf("10.244.1.2's count after its Service changed: %+v, want 7 packets, 700 bytes", got)
	}
}

// txConn records the transactions applied through it.
type txConn struct {
	Conn
	txs []*Transaction
}

func (c *txConn) Apply(tx *Transaction) error {
	c.txs = append(c.txs, tx)
	return c.Conn.Apply(tx)
}

// TestKernelNewConnectionRuleWalkDoesNotGrowWithEndpoints counts the rules a
// new connection to a Service meets in its chains (the services chain, the
// chains that pick its slot, cluster-dnat, and the DNAT chain up to the
// protocol's rule) for 2 to 1,000 endpoints: the same for every count the
// shared pick chains serve (pick-n, then the longest slot-k), the same for
// every count above (the Service's own pick chain), and never more than the
// shared path's. And an endpoint change, whether or not it changes the
// number of endpoints, adds no rule with a NAT expression (whose addition
// makes the kernel validate the whole table).
func TestKernelNewConnectionRuleWalkDoesNotGrowWithEndpoints(t *testing.T) {
	ns, _, b := kernelBackend(t)
	rec := &txConn{Conn: b.conn}
	b.conn = rec
	w := newWorld()
	web := statetest.PortName("demo", "web", "http", v1.ProtocolTCP)
	walks := map[int]int{}
	eps := func(n, first int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("10.244.%d.%d:8080", (first+i)/250, (first+i)%250+1))
		}
		return out
	}
	w.AddService(web, "10.96.0.10", 80, 0, eps(1, 0)...)
	mustSync(t, b, w.Next())
	counts := []int{2, 10, maxSharedPick, maxSharedPick + 1, 1000}
	for _, n := range counts {
		for _, first := range []int{0, 1000} { // the count, then the same count elsewhere
			rec.txs = nil
			w.SetEndpoints(web, eps(n, first)...)
			mustSync(t, b, w.Next())
			for _, tx := range rec.txs {
				for _, o := range tx.ops {
					if o.kind != opAddRule {
						continue
					}
					for _, e := range o.rule.Exprs {
						if _, ok := e.(*expr.NAT); ok {
							t.Errorf("%d endpoints: the change added a NAT rule to %s: %s", n, o.chain.Name, o.rule.String())
						}
					}
				}
			}
		}
		walk := 0
		picks := []string{sharedPickChain(n), slotChain(n - 1)}
		if n > maxSharedPick {
			picks = []string{"pick-svc-demo/web/tcp/http"}
		}
		for _, chain := range slices.Concat([]string{chainServices}, picks, []string{chainClusterDNAT}) {
			walk += strings.Count(strings.TrimSpace(nftIn(t, ns, "list", "chain", "ip", TableName, chain)), "\n") - 3
		}
		dnat := nftIn(t, ns, "list", "chain", "ip", TableName, chainEndpointDNAT)
		if !strings.Contains(dnat, "meta l4proto tcp dnat ip to ct mark map @endpoints") {
			t.Fatalf("no tcp rule in %s:\n%s", chainEndpointDNAT, dnat)
		}
		walk++ // TCP's is the chain's first rule
		walks[n] = walk
	}
	shared, own := walks[2], walks[maxSharedPick+1]
	for _, n := range counts {
		if n <= maxSharedPick && walks[n] != shared || n > maxSharedPick && walks[n] != own || own > shared {
			t.Errorf("rules a new connection meets, by number of endpoints: %v", walks)
			break
		}
	}
}
