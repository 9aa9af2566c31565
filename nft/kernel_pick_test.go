package nft

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
)

// Kernel tests of the Cluster policy's path without a chain of the
// Service's own: a ClusterIP of a Service port without session affinity
// (and with up to maxSharedPick endpoints) jumps from the service-ips map to
// the shared pick-n chain, which picks a slot of the block service-base
// gives, and the services chain's cluster-picked rule takes it on to
// cluster-dnat.

// TestKernelPlainServicePortHasNoChainAndStillDNATs: a plain Service port
// has no chain and no verdict of its own (no svc- or pick chain, no
// service-ips element), new connections to its ClusterIP reach its
// endpoints, and a Service with ClientIP affinity keeps its chain and is
// reached too. Every change of a plain Service writes data elements only,
// no chain, rule or verdict (a verdict makes the kernel validate every
// chain and verdict map element it can reach): an endpoint more, one less,
// one replaced, the Service deleted and created again.
func TestKernelPlainServicePortHasNoChainAndStillDNATs(t *testing.T) {
	ns, fd := testNetns(t)
	// No cluster CIDR: no masquerade, which would need a route out of lo.
	b, err := NewInNamespace(proxy.Config{MasqueradeBit: 14}, nil, fd)
	if err != nil {
		t.Fatal(err)
	}
	rec := &txConn{Conn: b.conn}
	b.conn = rec
	acc := loopbackEndpoints(t, ns, []string{"10.96.0.10", "10.96.0.11", "10.244.1.2", "10.244.1.3", "10.244.1.4", "10.244.1.5"},
		[]string{"10.244.1.2:8080", "10.244.1.3:8080", "10.244.1.4:8080", "10.244.1.5:8080"})
	w := newWorld()
	web, sticky := statetest.PortName("demo", "web", "http", v1.ProtocolTCP), statetest.PortName("demo", "sticky", "http", v1.ProtocolTCP)
	w.AddService(web, "10.96.0.10", 80, 0, "10.244.1.2:8080", "10.244.1.3:8080")
	w.AddService(sticky, "10.96.0.11", 80, 0, "10.244.1.4:8080")
	w.Services[sticky].AffinityTimeout = time.Hour
	mustSync(t, b, w.Next())

	chains := nftIn(t, ns, "list", "chains", "ip")
	if strings.Contains(chains, "chain svc-demo/web/") || strings.Contains(chains, "chain pick-svc-demo/web/") {
		t.Errorf("want no chain of demo/web's own:\n%s", chains)
	}
	if !strings.Contains(chains, "chain svc-demo/sticky/tcp/http") {
		t.Errorf("the Service with session affinity lost its chain:\n%s", chains)
	}
	if l := nftIn(t, ns, "list", "map", "ip", TableName, mapServiceSlots); !strings.Contains(l, "10.96.0.10 . tcp . 80 comment \"demo/web:http\" : 0x02") {
		t.Errorf("service-slots lacks demo/web's count 2 and slots:\n%s", l)
	}
	if l := nftIn(t, ns, "list", "map", "ip", TableName, mapServiceIPs); strings.Contains(l, "10.96.0.10 ") {
		t.Errorf("service-ips has a verdict for demo/web:\n%s", l)
	}
	if l := nftIn(t, ns, "list", "map", "ip", TableName, mapServiceIPs); !strings.Contains(l,
		"10.96.0.11 . tcp . 80 comment \"demo/sticky:http\" : goto svc-demo/sticky/tcp/http") {
		t.Errorf("service-ips lacks demo/sticky's chain:\n%s", l)
	}

	// Nothing listens on the ClusterIPs: a connection is accepted only
	// through DNAT.
	dialN(t, ns, "10.96.0.10:80", 20)
	dialN(t, ns, "10.96.0.11:80", 3)
	// Counts are since the start: each step's are what it adds.
	var last map[string]int
	waitAccepted := func(eps []string, web, sticky int) {
		t.Helper()
		total := func(got map[string]int) (n int) {
			for _, c := range got {
				n += c
			}
			return n
		}
		want := total(last) + web + sticky
		got := acc.await(func(got map[string]int) bool { return total(got) >= want })
		added := map[string]int{}
		for e, c := range got {
			added[e] = c - last[e]
		}
		last = got
		fine := added["10.244.1.4:8080"] == sticky
		for _, e := range eps {
			fine = fine && added[e] > 0
			web -= added[e]
		}
		if !fine || web != 0 {
			t.Fatalf("connections accepted by endpoint: %v, want %d more to demo/web's %v (some each) and %d to demo/sticky's",
				added, web, eps, sticky)
		}
	}
	waitAccepted([]string{"10.244.1.2:8080", "10.244.1.3:8080"}, 20, 3)

	// One endpoint more, one less, one replaced by another; the Service
	// deleted, then created again.
	for _, step := range []struct {
		eps    []string
		remove bool
	}{
		{eps: []string{"10.244.1.2:8080", "10.244.1.3:8080", "10.244.1.5:8080"}},
		{eps: []string{"10.244.1.2:8080", "10.244.1.3:8080"}},
		{eps: []string{"10.244.1.2:8080", "10.244.1.5:8080"}},
		{remove: true},
		{eps: []string{"10.244.1.3:8080", "10.244.1.5:8080"}},
	} {
		rec.txs = nil
		switch {
		case step.remove:
			w.Remove(web)
		case w.Services[web] == nil:
			w.AddService(web, "10.96.0.10", 80, 0, step.eps...)
		default:
			w.SetEndpoints(web, step.eps...)
		}
		mustSync(t, b, w.Next())
		for _, tx := range rec.txs {
			for _, o := range tx.ops {
				switch o.kind {
				case opAddChain, opDelChain, opFlushChain:
					t.Errorf("%v: the change added, deleted or rewrote chain %s", step.eps, o.chain.Name)
				case opAddRule:
					t.Errorf("%v: the change added to %s the rule %s", step.eps, o.chain.Name, o.rule.String())
				case opAddElement, opDelElement:
					for _, e := range o.elems {
						if e.Verdict != verdictNone || setByName(familyIPv4, o.set.Name).VMap {
							t.Errorf("%v: the change wrote to %s the verdict element %s : %s", step.eps, o.set.Name, e.KeyText, e.value())
						}
					}
				}
			}
		}
		if step.remove {
			continue
		}
		dialN(t, ns, "10.96.0.10:80", 20)
		waitAccepted(step.eps, 20, 0)
	}
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
delete element ip kp service-slots { 10.96.0.10 . tcp . 80 }
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
