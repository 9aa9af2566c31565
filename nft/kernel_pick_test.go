package nft

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables/expr"
	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
)

// Kernel tests of the Cluster policy's path without a Service chain: a
// ClusterIP of a Service port without session affinity jumps from the
// service-ips map straight to its pick chain, and the services chain's
// cluster-picked rule takes it on to cluster-dnat.

// TestKernelPlainServicePortHasNoChainAndStillDNATs: a plain Service port
// has no svc- chain (only its pick chain), new connections to its ClusterIP
// reach its endpoints, and a Service with ClientIP affinity keeps its
// chain and is reached too. Changing the number of endpoints rewrites the
// pick chain alone, with no rule that jumps, goes to a chain, looks a set
// up or NATs (any of which makes the kernel validate the whole table).
func TestKernelPlainServicePortHasNoChainAndStillDNATs(t *testing.T) {
	ns, fd := testNetns(t)
	// No cluster CIDR: no masquerade, which would need a route out of lo.
	b, err := NewInNamespace(proxy.Config{MasqueradeBit: 14}, nil, fd)
	if err != nil {
		t.Fatal(err)
	}
	rec := &txConn{Conn: b.conn}
	b.conn = rec
	acc := loopbackEndpoints(t, ns, []string{"10.96.0.10", "10.96.0.11", "10.244.1.2", "10.244.1.3", "10.244.1.4"},
		[]string{"10.244.1.2:8080", "10.244.1.3:8080", "10.244.1.4:8080"})
	w := newWorld()
	web, sticky := statetest.PortName("demo", "web", "http", v1.ProtocolTCP), statetest.PortName("demo", "sticky", "http", v1.ProtocolTCP)
	w.AddService(web, "10.96.0.10", 80, 0, "10.244.1.2:8080", "10.244.1.3:8080")
	w.AddService(sticky, "10.96.0.11", 80, 0, "10.244.1.4:8080")
	w.Services[sticky].AffinityTimeout = time.Hour
	mustSync(t, b, w.Next())

	chains := nftIn(t, ns, "list", "chains", "ip")
	if strings.Contains(chains, "chain svc-demo/web/") || !strings.Contains(chains, "chain pick-svc-demo/web/tcp/http") {
		t.Errorf("want a pick chain and no Service chain for demo/web:\n%s", chains)
	}
	if !strings.Contains(chains, "chain svc-demo/sticky/tcp/http") {
		t.Errorf("the Service with session affinity lost its chain:\n%s", chains)
	}
	for _, want := range []string{"10.96.0.10 . tcp . 80 comment \"demo/web:http\" : jump pick-svc-demo/web/tcp/http",
		"10.96.0.11 . tcp . 80 comment \"demo/sticky:http\" : goto svc-demo/sticky/tcp/http"} {
		if m := nftIn(t, ns, "list", "map", "ip", TableName, mapServiceIPs); !strings.Contains(m, want) {
			t.Errorf("service-ips lacks %q:\n%s", want, m)
		}
	}

	// Nothing listens on the ClusterIPs: a connection is accepted only
	// through DNAT.
	dialN(t, ns, "10.96.0.10:80", 20)
	dialN(t, ns, "10.96.0.11:80", 3)
	waitAccepted := func(want map[string]int) {
		t.Helper()
		ok := func(got map[string]int) bool {
			return got["10.244.1.2:8080"]+got["10.244.1.3:8080"] == want["web"] && got["10.244.1.4:8080"] == want["sticky"]
		}
		if got := acc.await(ok); !ok(got) || got["10.244.1.2:8080"] == 0 || got["10.244.1.3:8080"] == 0 {
			t.Fatalf("connections accepted by endpoint: %v, want %d to demo/web's two (some each) and %d to demo/sticky's",
				got, want["web"], want["sticky"])
		}
	}
	waitAccepted(map[string]int{"web": 20, "sticky": 3})

	// One endpoint more, then one less: the pick chain alone is rewritten.
	for _, eps := range [][]string{
		{"10.244.1.2:8080", "10.244.1.3:8080", "10.244.1.4:8080"},
		{"10.244.1.2:8080", "10.244.1.3:8080"},
	} {
		rec.txs = nil
		w.SetEndpoints(web, eps...)
		mustSync(t, b, w.Next())
		for _, tx := range rec.txs {
			for _, o := range tx.ops {
				switch o.kind {
				case opAddChain, opDelChain:
					t.Errorf("%d endpoints: the change added or deleted chain %s", len(eps), o.chain.Name)
				case opFlushChain:
					if o.chain.Name != "pick-svc-demo/web/tcp/http" {
						t.Errorf("%d endpoints: the change rewrote chain %s", len(eps), o.chain.Name)
					}
				case opAddRule:
					for _, e := range o.rule.Exprs {
						switch e := e.(type) {
						case *expr.NAT, *expr.Lookup:
							t.Errorf("%d endpoints: the change added to %s a rule with %T: %s", len(eps), o.chain.Name, e, o.rule.String())
						case *expr.Verdict:
							if e.Kind == expr.VerdictJump || e.Kind == expr.VerdictGoto {
								t.Errorf("%d endpoints: the change added to %s a rule that jumps: %s", len(eps), o.chain.Name, o.rule.String())
							}
						}
					}
				}
			}
		}
	}
	dialN(t, ns, "10.96.0.10:80", 20)
	waitAccepted(map[string]int{"web": 40, "sticky": 3})
}

// TestKernelRestartOverTheServiceChainLayoutReplacesIt: a kp upgraded in
// place over the table of the version before (a svc- chain per Service
// port, service-ips going to it, no cluster-picked set) leaves, after its
// first sync, the table a fresh kp writes: in one transaction, with every
// reference made before what it names goes.
func TestKernelRestartOverTheServiceChainLayoutReplacesIt(t *testing.T) {
	ns, fd, b := kernelBackend(t)
	w := newWorld()
	web := statetest.PortName("demo", "web", "http", v1.ProtocolTCP)
	w.AddService(web, "10.96.0.10", 80, 30080, "10.244.1.2:8080", "10.244.1.3:8080")
	mustSync(t, b, w.Next())
	want := nftIn(t, ns, "list", "ruleset")

	// Back to the earlier layout, by hand.
	old := t.TempDir() + "/old.nft"
	script := `add chain ip kp svc-demo/web/tcp/http
add rule ip kp svc-demo/web/tcp/http jump pick-svc-demo/web/tcp/http comment "demo/web:http"
add rule ip kp svc-demo/web/tcp/http goto cluster-dnat comment "demo/web:http"
delete element ip kp service-ips { 10.96.0.10 . tcp . 80 }
add element ip kp service-ips { 10.96.0.10 . tcp . 80 comment "demo/web:http" : goto svc-demo/web/tcp/http }
flush chain ip kp ext-demo/web/tcp/http
add rule ip kp ext-demo/web/tcp/http jump mark-for-masquerade comment "demo/web:http"
add rule ip kp ext-demo/web/tcp/http goto svc-demo/web/tcp/http comment "demo/web:http"
flush chain ip kp services
add rule ip kp services ip daddr . meta l4proto . th dport vmap @service-ips
add rule ip kp services ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports
delete set ip kp cluster-picked
`
	if err := os.WriteFile(old, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	nftIn(t, ns, "-f", old)
	if l := nftIn(t, ns, "list", "table", "ip", TableName); !strings.Contains(l, "goto svc-demo/web/tcp/http") || strings.Contains(l, "cluster-picked") {
		t.Fatalf("the earlier layout did not load:\n%s", l)
	}

	rec := &txConn{}
	restarted, err := NewInNamespace(testConfig(), nil, fd)
	if err != nil {
		t.Fatal(err)
	}
	rec.Conn = restarted.conn
	restarted.conn = rec
	mustSync(t, restarted, w.Next())
	if len(rec.txs) != 1 {
		t.Errorf("the first sync over the table took %d transactions, want 1", len(rec.txs))
	}
	if got := nftIn(t, ns, "list", "ruleset"); !slices.Equal(sortedLines(got), sortedLines(want)) {
		t.Errorf("after the first sync over the earlier layout:\n%s\nwant what a fresh kp writes:\n%s", got, want)
	}
}
