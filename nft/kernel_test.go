package nft

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"

	"golang.org/x/sys/unix"

	"github.com/kpproxy/kp/test/netns"
)

// testNetns creates a network namespace for one test and deletes it when the
// test ends, whatever the outcome. It returns the name and an open fd.
func testNetns(t *testing.T) (string, int) {
	t.Helper()
	netns.Require(t, "nft")
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "kp-nft-" + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	fd, err := unix.Open("/run/netns/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return name, fd
}

func nftIn(t *testing.T, ns string, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns, "nft"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nft %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestKernelRulesetListsAndReloadsWithNFT(t *testing.T) {
	ns, fd := testNetns(t)
	b, err := NewInNamespace(testConfig(), nil, fd)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	w := newWorld()
	web := spName("demo", "web", "http")
	w.addService(web, "10.96.0.10", 80, 30080, "10.244.1.2:8080", "10.244.1.3:8080")
	w.addService(spName("demo", "empty", ""), "10.96.0.11", 53, 0)
	// This kernel may have no SCTP sockets, but nf_tables matches and
	// NATs SCTP by number: the rules must load and list.
	sctp := proxy.ServicePortName{NamespacedName: web.NamespacedName, Port: "sctp", Protocol: v1.ProtocolSCTP}
	w.addService(sctp, "10.96.0.10", 9000, 30900, "10.244.1.2:9000")
	mustSync(t, b, w.state())

	listing := nftIn(t, ns, "list", "ruleset")
	for _, want := range []string{
		`comment "demo/web:http"`,
		// numgen's keys in host order would list as 16777216.
		"numgen random mod 2 vmap { 0 : goto ep-demo/web/tcp/http__10.244.1.2/8080, 1 : goto ep-demo/web/tcp/http__10.244.1.3/8080 }",
		"dnat to 10.244.1.3:8080",
		`10.96.0.11 . tcp . 53 comment "demo/empty" : goto reject-chain`,
		"counter ep-demo/web/tcp/http__10.244.1.2/8080",
		"10.96.0.10 . sctp . 9000",
		"sctp . 30900",
		"meta l4proto sctp dnat to 10.244.1.2:9000",
	} {
		if !strings.Contains(listing, want) {
			t.Errorf("nft list ruleset lacks %q:\n%s", want, listing)
		}
	}
	// What kp wrote must load back with the nft CLI: the listing is a
	// faithful, parseable description (operators debug with it).
	ns2, _ := testNetns(t)
	path := t.TempDir() + "/ruleset.nft"
	if err := os.WriteFile(path, []byte(listing), 0o644); err != nil {
		t.Fatal(err)
	}
	nftIn(t, ns2, "-f", path)
	if reloaded := nftIn(t, ns2, "list", "ruleset"); reloaded != listing {
		t.Errorf("the listing does not reload to itself:\n--- kp wrote ---\n%s\n--- reloaded ---\n%s", listing, reloaded)
	}

	// Partial sync against the real kernel, then a new backend (kp
	// restarted) reconciling over the existing table.
	w.setEndpoints(web, "10.244.1.2:8080")
	mustSync(t, b, w.state())
	b2, _ := NewInNamespace(testConfig(), nil, fd)
	mustSync(t, b2, w.state())
	if b2.LastTransactionOps() == 0 {
		t.Error("restart reconcile sent nothing")
	}
	listing = nftIn(t, ns, "list", "ruleset")
	if strings.Contains(listing, "10.244.1.3") {
		t.Errorf("removed endpoint still programmed:\n%s", listing)
	}
}

func TestKernelCleanupTouchesNothingElse(t *testing.T) {
	ns, fd := testNetns(t)
	nftIn(t, ns, "add", "table", "inet", "other")
	nftIn(t, ns, "add", "chain", "inet", "other", "input", "{ type filter hook input priority 0; }")
	b, _ := NewInNamespace(testConfig(), nil, fd)
	w := newWorld()
	w.addService(spName("a", "b", ""), "10.96.0.1", 80, 0, "10.244.0.1:80")
	mustSync(t, b, w.state())
	if err := b.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	listing := nftIn(t, ns, "list", "ruleset")
	if strings.Contains(listing, "table ip kp") || strings.Contains(listing, "table ip6 kp") {
		t.Errorf("kp tables left:\n%s", listing)
	}
	if !strings.Contains(listing, "table inet other") || !strings.Contains(listing, "chain input") {
		t.Errorf("cleanup touched another table:\n%s", listing)
	}
	// Cleanup with nothing to clean succeeds.
	if err := b.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestKernelAcceptsEveryShapeChangeAndLeavesNothingStale walks one Service
// through the shapes kp renders, syncing each against the real kernel: each
// batch must be accepted as it is ordered (references before what they
// name, sets declared anew after the rules naming them are flushed), and
// after the Service goes nothing of it may stay.
func TestKernelAcceptsEveryShapeChangeAndLeavesNothingStale(t *testing.T) {
	ns, fd := testNetns(t)
	b, err := NewInNamespace(testConfig(), nil, fd)
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld()
	name := spName("demo", "shape", "http")
	w.addService(spName("demo", "other", ""), "10.96.0.99", 80, 0, "10.244.9.9:80")
	w.addService(name, "10.96.0.20", 80, 0, "10.244.1.2:8080", "10.244.1.3:8080")
	mustSync(t, b, w.state())

	local := func(eps ...proxy.Endpoint) []proxy.Endpoint {
		for i := range eps {
			eps[i].NodeName = w.node.Name
		}
		return eps
	}
	steps := []struct {
		what   string
		change func(sp *proxy.ServicePort)
		want   []string
	}{
		{"NodePort", func(sp *proxy.ServicePort) { sp.Type, sp.NodePort = v1.ServiceTypeNodePort, 30020 },
			[]string{"tcp . 30020", "chain ext-demo/shape/tcp/http"}},
		{"externalTrafficPolicy Local without local endpoints", func(sp *proxy.ServicePort) { sp.ExternalPolicyLocal = true },
			[]string{"fib saddr type local", "tcp . 30020 comment \"demo/shape:http\" : drop"}},
		{"LoadBalancer with source ranges and affinity", func(sp *proxy.ServicePort) {
			sp.Type = v1.ServiceTypeLoadBalancer
			sp.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("192.0.2.10")}
			sp.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("203.0.113.128/25")}
			sp.AffinityTimeout = 3 * time.Hour
		}, []string{"chain firewall-demo/shape/tcp/http", "set affinity-demo/shape/tcp/http__10.244.1.2/8080", "timeout 3h", "203.0.113.0/24"}},
		{"affinity timeout changed", func(sp *proxy.ServicePort) { sp.AffinityTimeout = 10 * time.Second },
			[]string{"timeout 10s"}},
		{"internalTrafficPolicy Local", func(sp *proxy.ServicePort) { sp.InternalPolicyLocal = true }, nil},
		{"back to a plain ClusterIP", func(sp *proxy.ServicePort) {
			*sp = proxy.ServicePort{Name: sp.Name, Type: v1.ServiceTypeClusterIP, ClusterIPs: sp.ClusterIPs, Port: sp.Port, Protocol: sp.Protocol}
		}, []string{"10.96.0.20 . tcp . 80 comment \"demo/shape:http\" : goto svc-demo/shape/tcp/http"}},
	}
	for _, st := range steps {
		sp := *w.services[name]
		st.change(&sp)
		w.services[name] = &sp
		w.changed[name] = struct{}{}
		if st.what == "internalTrafficPolicy Local" {
			w.endpoints[name] = local(w.endpoints[name][0])
		}
		if err := b.Sync(context.Background(), w.state()); err != nil {
			t.Fatalf("%s: %v", st.what, err)
		}
		listing := nftIn(t, ns, "list", "ruleset")
		for _, want := range st.want {
			if !strings.Contains(listing, want) {
				t.Errorf("%s: ruleset lacks %q:\n%s", st.what, want, listing)
			}
		}
	}
	w.remove(name)
	mustSync(t, b, w.state())
	if listing := nftIn(t, ns, "list", "ruleset"); strings.Contains(listing, "demo/shape") || strings.Contains(listing, "10.96.0.20") {
		t.Errorf("the deleted Service left objects behind:\n%s", listing)
	}
}

// A full sync of many Services is one transaction far larger than a
// netlink socket's default buffers (4,400 operations for 100 Services of
// 10 endpoints overran them), and its service-ips elements far more than
// one netlink attribute holds (64 KiB: about 600 elements); it must still
// apply, as one transaction, with every Service in the kernel afterwards.
func TestKernelTransactionLargerThanDefaultSocketBuffersApplies(t *testing.T) {
	ns, fd := testNetns(t)
	b, err := NewInNamespace(testConfig(), nil, fd)
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld()
	const services, endpoints = 1000, 10
	for i := 0; i < services; i++ {
		eps := make([]string, endpoints)
		for j := range eps {
			eps[j] = fmt.Sprintf("10.244.%d.%d:8080", i/25, (i%25)*10+j)
		}
		w.addService(spName("demo", fmt.Sprintf("svc-%d", i), "http"),
			fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), 80, 0, eps...)
	}
	mustSync(t, b, w.state())
	if ops := b.LastTransactionOps(); ops < 20000 {
		t.Fatalf("the full sync sent %d operations; the test needs one beyond the default buffers", ops)
	}
	listing := nftIn(t, ns, "list", "map", "ip", TableName, mapServiceIPs)
	if got := strings.Count(listing, " . tcp . 80 "); got != services {
		t.Errorf("service-ips holds %d of %d Services", got, services)
	}
}
