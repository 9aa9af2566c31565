package nft

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
)

// newWorld is the nft tests' World: the node "node" at 192.168.0.2,
// endpoints on no node.
func newWorld() *statetest.World { return statetest.New(statetest.Node("node", "192.168.0.2")) }

func testConfig() proxy.Config {
	return proxy.Config{MasqueradeBit: 14, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}
}

func newFakeBackend(t *testing.T, fake *Fake) *Backend {
	t.Helper()
	b, err := newBackend(testConfig(), nil, fake)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustSync(t *testing.T, b *Backend, s *proxy.State) {
	t.Helper()
	if err := b.Sync(context.Background(), s); err != nil {
		t.Fatal(err)
	}
}

func TestFirstSyncProgramsServicesAndEndpoints(t *testing.T) {
	fake := NewFake()
	b := newFakeBackend(t, fake)
	w := newWorld()
	web := statetest.PortName("demo", "web", "http", v1.ProtocolTCP)
	w.AddService(web, "10.96.0.10", 80, 30080, "10.244.1.2:8080", "10.244.1.3:8080")
	mustSync(t, b, w.Next())
	dump := fake.Dump()
	for _, want := range []string{
		// No chain or verdict of the Service's own for its ClusterIP:
		// service-slots gives its count (2) and the base of its slots
		// (8) to the shared chains, which pick a slot and go on to the
		// static chains, which DNAT to the endpoint the slot holds.
		"set service-slots { 10.96.0.10 . tcp . 80 : 0x02000008 }",
		"set service-ips {  }",
		"set cluster-picked {  }",
		// External traffic goes through the Service's own chains.
		"tcp . 30080 : goto ext-demo/web/tcp/http",
		"chain ext-demo/web/tcp/http\n    jump mark-for-masquerade comment \"demo/web:http\"\n    jump pick-svc-demo/web/tcp/http comment \"demo/web:http\"\n    goto endpoint-dnat ",
		"chain pick-svc-demo/web/tcp/http\n    ct mark set numgen random mod 2 offset 8 ",
		"set endpoints { 0x00000008 : 10.244.1.2 . 8080, 0x00000009 : 10.244.1.3 . 8080 }",
		"meta l4proto tcp dnat ip to ct mark map @endpoints",
		"10.244.1.2 . 10.244.1.2",
		`comment "demo/web:http"`,
		"set nodeport-ips { 192.168.0.2 }",
	} {
		if !strings.Contains(dump, want) {
			t.Errorf("ruleset lacks %q:\n%s", want, dump)
		}
	}
	if strings.Contains(dump, "chain svc-") {
		t.Errorf("a Service chain for a Service port without session affinity:\n%s", dump)
	}
}

func TestServiceWithNoEndpointsIsRejected(t *testing.T) {
	fake := NewFake()
	b := newFakeBackend(t, fake)
	w := newWorld()
	n := statetest.PortName("demo", "empty", "", v1.ProtocolTCP)
	w.AddService(n, "10.96.0.11", 80, 30081)
	mustSync(t, b, w.Next())
	dump := fake.Dump()
	for _, want := range []string{"10.96.0.11 . tcp . 80 : goto reject-chain", "tcp . 30081 : goto reject-chain"} {
		if !strings.Contains(dump, want) {
			t.Errorf("ruleset lacks %q:\n%s", want, dump)
		}
	}
	if strings.Contains(dump, "svc-demo/empty") {
		t.Errorf("service chain written for a service with no endpoints:\n%s", dump)
	}
	// First endpoint appears: the reject entry goes, the service entry comes.
	w.SetEndpoints(n, "10.244.1.2:80")
	mustSync(t, b, w.Next())
	dump = fake.Dump()
	if strings.Contains(dump, "10.96.0.11 . tcp . 80 : goto reject-chain") || strings.Contains(dump, "tcp . 30081 : goto reject-chain") ||
		!strings.Contains(dump, "10.96.0.11 . tcp . 80 : 0x01000008") {
		t.Errorf("after the first endpoint appeared:\n%s", dump)
	}
}

func TestPartialSyncWritesOnlyTheChangedService(t *testing.T) {
	fake := NewFake()
	b := newFakeBackend(t, fake)
	w := newWorld()
	for i := range 200 {
		w.AddService(statetest.PortName("ns", fmt.Sprintf("svc%d", i), "p", v1.ProtocolTCP), fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), 80, 0,
			fmt.Sprintf("10.244.%d.1:80", i%250), fmt.Sprintf("10.244.%d.2:80", i%250))
	}
	mustSync(t, b, w.Next())
	before := fake.Dump()

	w.SetEndpoints(statetest.PortName("ns", "svc7", "p", v1.ProtocolTCP), "10.244.7.1:80", "10.244.7.3:80")
	tx := captureTx(t, b, fake, w.Next())
	for _, line := range strings.Split(strings.TrimSpace(tx), "\n") {
		// svc7's chains, and its endpoints' slot and hairpin elements
		// (whose slots the fake's dump names below).
		if !strings.Contains(line, "ns/svc7/") && !strings.Contains(line, "hairpin { 10.244.7.") &&
			!strings.Contains(line, "element ip kp endpoints {") {
			t.Errorf("partial sync touched another object: %s", line)
		}
	}
	// The same number of endpoints: element updates only, no rule.
	if strings.Contains(tx, "rule") || fake.LastOps > 4 {
		t.Errorf("partial sync of one endpoint change sent %d operations:\n%s", fake.LastOps, tx)
	}
	after := fake.Dump()
	if strings.Contains(after, "10.244.7.2 . 80") || !strings.Contains(after, "10.244.7.3 . 80") {
		t.Errorf("endpoint change not applied")
	}
	if strings.Count(before, "\n") != strings.Count(after, "\n") {
		t.Errorf("ruleset size changed from %d to %d lines", strings.Count(before, "\n"), strings.Count(after, "\n"))
	}

	// A sync with nothing changed sends nothing.
	fake.LastOps = -1
	mustSync(t, b, w.Next())
	if fake.LastOps != -1 {
		t.Errorf("a sync with no change sent %d operations", fake.LastOps)
	}
}

// captureTx runs a sync and returns the transaction it applied as text.
func captureTx(t *testing.T, b *Backend, fake *Fake, s *proxy.State) string {
	t.Helper()
	rec := &recordingConn{Conn: fake}
	b.conn = rec
	defer func() { b.conn = fake }()
	mustSync(t, b, s)
	return rec.last
}

type recordingConn struct {
	Conn
	last string
}

func (r *recordingConn) Apply(tx *Transaction) error {
	r.last = tx.String()
	return r.Conn.Apply(tx)
}

func TestDeletedServiceLeavesNothingBehind(t *testing.T) {
	fake := NewFake()
	b := newFakeBackend(t, fake)
	w := newWorld()
	keep, gone := statetest.PortName("a", "keep", "", v1.ProtocolTCP), statetest.PortName("a", "gone", "", v1.ProtocolTCP)
	w.AddService(keep, "10.96.0.1", 80, 30001, "10.244.0.5:80")
	w.AddService(gone, "10.96.0.2", 80, 30002, "10.244.0.6:80", "10.244.0.7:80")
	mustSync(t, b, w.Next())
	w.Remove(gone)
	mustSync(t, b, w.Next())
	dump := fake.Dump()
	if strings.Contains(dump, "a/gone") || strings.Contains(dump, "10.96.0.2") || strings.Contains(dump, "30002") {
		t.Errorf("deleted service left objects:\n%s", dump)
	}
	if !strings.Contains(dump, "pick-svc-a/keep/tcp/80") {
		t.Errorf("other service lost:\n%s", dump)
	}
}

func TestRestartReconcilesWithoutRemovingLiveObjects(t *testing.T) {
	fake := NewFake()
	w := newWorld()
	web := statetest.PortName("demo", "web", "", v1.ProtocolTCP)
	stale := statetest.PortName("demo", "stale", "", v1.ProtocolTCP)
	w.AddService(web, "10.96.0.10", 80, 0, "10.244.1.2:80")
	w.AddService(stale, "10.96.0.12", 80, 0, "10.244.1.9:80")
	mustSync(t, newFakeBackend(t, fake), w.Next())

	// A new kp process: it must not delete the table or the live service's
	// objects, only rewrite them in place and remove what is stale.
	w.Remove(stale)
	b2 := newFakeBackend(t, fake)
	tx := captureTx(t, b2, fake, w.Next())
	for _, line := range strings.Split(tx, "\n") {
		if strings.HasPrefix(line, "delete") && strings.Contains(line, "demo/web") ||
			strings.HasPrefix(line, "delete table") || strings.HasPrefix(line, "delete element ip kp service-ips { 10.96.0.10") {
			t.Errorf("restart deleted a live object: %s", line)
		}
	}
	dump := fake.Dump()
	if strings.Contains(dump, "demo/stale") {
		t.Errorf("stale service survived the restart:\n%s", dump)
	}
	if !strings.Contains(dump, "10.96.0.10 . tcp . 80 : 0x0") {
		t.Errorf("live service lost:\n%s", dump)
	}
}

func TestFailedSyncIsFollowedByAFullReconcile(t *testing.T) {
	fake := NewFake()
	b := newFakeBackend(t, fake)
	w := newWorld()
	a, c := statetest.PortName("x", "a", "", v1.ProtocolTCP), statetest.PortName("x", "c", "", v1.ProtocolTCP)
	w.AddService(a, "10.96.0.1", 80, 0, "10.244.0.1:80")
	mustSync(t, b, w.Next())
	fake.FailNext = errors.New("injected")
	w.AddService(c, "10.96.0.3", 80, 0, "10.244.0.3:80")
	if err := b.Sync(context.Background(), w.Next()); err == nil {
		t.Fatal("sync did not report the failure")
	}
	// The next State no longer lists c as changed; a full sync must still
	// program it.
	mustSync(t, b, w.Next())
	if !strings.Contains(fake.Dump(), "10.96.0.3 . tcp . 80 : 0x01") {
		t.Errorf("service from the failed sync missing:\n%s", fake.Dump())
	}
}

func TestCleanupRemovesBothTables(t *testing.T) {
	fake := NewFake()
	b := newFakeBackend(t, fake)
	w := newWorld()
	w.AddService(statetest.PortName("x", "a", "", v1.ProtocolTCP), "10.96.0.1", 80, 0, "10.244.0.1:80")
	mustSync(t, b, w.Next())
	if err := b.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(fake.Tables) != 0 {
		t.Errorf("tables left: %v", fake.Dump())
	}
}

// TestASkeletonChangeReachesAPartialSync: a partial sync leaves the
// skeleton out of its diff while it is the one of the sync before; when
// what it is built from changes (here the service CIDRs, which change
// without a full sync), the partial sync writes it.
func TestASkeletonChangeReachesAPartialSync(t *testing.T) {
	fake := NewFake()
	b := newFakeBackend(t, fake)
	w := newWorld()
	web := statetest.PortName("demo", "web", "http", v1.ProtocolTCP)
	w.AddService(web, "10.96.0.10", 80, 0, "10.244.1.2:8080")
	w.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}
	mustSync(t, b, w.Next())
	w.SetEndpoints(web, "10.244.1.3:8080")
	mustSync(t, b, w.Next())
	w.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("10.100.0.0/16")}
	w.SetEndpoints(web, "10.244.1.4:8080")
	mustSync(t, b, w.Next())
	if b.LastSyncFull() {
		t.Fatal("the sync was a full one: the test wants a partial sync")
	}
	if dump := fake.Dump(); !strings.Contains(dump, "10.100.0.0/16") || !strings.Contains(dump, "10.244.1.4 . 8080") {
		t.Errorf("the partial sync left the new service CIDR out, or the endpoint:\n%s", dump)
	}
}
