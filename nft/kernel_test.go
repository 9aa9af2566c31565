package nft

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"

	"golang.org/x/sys/unix"

	"github.com/kpproxy/kp/test/netns"
)

// testNetns creates a network namespace for one test and deletes it when the
// test ends, whatever the outcome. It returns the name and an open fd.
func testNetns(t testing.TB) (string, int) {
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

// kernelBackend is a backend in a test namespace of its own; it returns
// the namespace's name and fd too.
func kernelBackend(t testing.TB) (string, int, *Backend) {
	t.Helper()
	ns, fd := testNetns(t)
	b, err := NewInNamespace(testConfig(), nil, fd)
	if err != nil {
		t.Fatal(err)
	}
	return ns, fd, b
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
	ns, fd, b := kernelBackend(t)
	if err := b.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	w := newWorld()
	web := statetest.PortName("demo", "web", "http", v1.ProtocolTCP)
	w.AddService(web, "10.96.0.10", 80, 30080, "10.244.1.2:8080", "10.244.1.3:8080")
	w.AddService(statetest.PortName("demo", "empty", "", v1.ProtocolTCP), "10.96.0.11", 53, 0)
	// This kernel may have no SCTP sockets, but nf_tables matches and
	// NATs SCTP by number: the rules must load and list.
	sctp := proxy.ServicePortName{NamespacedName: web.NamespacedName, Port: "sctp", Protocol: v1.ProtocolSCTP}
	w.AddService(sctp, "10.96.0.10", 9000, 30900, "10.244.1.2:9000")
	st := w.Next()
	mustSync(t, b, st)
	// Every endpoint's DNAT rules are read back as its counter.
	counters, err := b.EndpointCounters(st)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []string{"10.244.1.2:8080", "10.244.1.3:8080"} {
		if _, ok := counters[proxy.EndpointRef{ServicePort: web, Endpoint: netip.MustParseAddrPort(e)}]; !ok {
			t.Errorf("no counter read for %s: %v", e, counters)
		}
	}

	listing := nftIn(t, ns, "list", "ruleset")
	for _, want := range []string{
		`comment "demo/web:http"`,
		// Slots are marks, in host order: sent the other way, slot 1
		// would list as 0x01000000.
		"ct mark set numgen random mod 2 offset 8 comment",
		`0x00000008 counter packets 0 bytes 0 comment "demo/web:http" : 10.244.1.2 . 8080`,
		`0x00000009 counter packets 0 bytes 0 comment "demo/web:http" : 10.244.1.3 . 8080`,
		"jump pick-svc-demo/web/tcp/http",
		// The shared picks: a mark-typed map's data in host order too.
		`10.96.0.10 . tcp . 80 comment "demo/web:http" : 0x02000008`,
		"ct mark set ip daddr . meta l4proto . th dport map @service-slots goto shared-pick",
		"ct mark & 0xff000000 vmap @count-pick",
		"ct mark set numgen random mod 2\n",
		"ct mark vmap @slot-pick",
		"ct mark set ip daddr . meta l4proto . th dport map @service-slots\n\t\tct mark set ct mark & 0x00ffffff | 0x00000001\n\t\tgoto cluster-dnat",
		"goto endpoint-dnat",
		"meta l4proto tcp dnat ip to ct mark map @endpoints",
		"ct status dnat ip saddr . ip daddr @hairpin jump mark-for-masquerade",
		`10.96.0.11 . tcp . 53 comment "demo/empty" : goto reject-chain`,
		"10.96.0.10 . sctp . 9000",
		"sctp . 30900",
		"meta l4proto sctp dnat ip to ct mark map @endpoints",
		`comment "demo/web:sctp" : 10.244.1.2 . 9000`,
	} {
		if !strings.Contains(listing, want) {
			t.Errorf("nft list ruleset lacks %q:\n%s", want, listing)
		}
	}
	// What kp wrote must load back with the nft CLI: the listing is a
	// faithful, parseable description (operators debug with it).
	requireReloads(t, listing)

	// Partial sync against the real kernel, then a new backend (kp
	// restarted) reconciling over the existing table.
	w.SetEndpoints(web, "10.244.1.2:8080")
	mustSync(t, b, w.Next())
	b2, _ := NewInNamespace(testConfig(), nil, fd)
	mustSync(t, b2, w.Next())
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
	w.AddService(statetest.PortName("a", "b", "", v1.ProtocolTCP), "10.96.0.1", 80, 0, "10.244.0.1:80")
	mustSync(t, b, w.Next())
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
	ns, _, b := kernelBackend(t)
	w := newWorld()
	name := statetest.PortName("demo", "shape", "http", v1.ProtocolTCP)
	w.AddService(statetest.PortName("demo", "other", "", v1.ProtocolTCP), "10.96.0.99", 80, 0, "10.244.9.9:80")
	w.AddService(name, "10.96.0.20", 80, 0, "10.244.1.2:8080", "10.244.1.3:8080")
	mustSync(t, b, w.Next())

	local := func(eps ...proxy.Endpoint) []proxy.Endpoint {
		for i := range eps {
			eps[i] = eps[i].At(w.Node.Name, "")
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
		// Without affinity the Local policy has a chain of its own only
		// while the ClusterIPs go to it; else the ext- chain jumps to
		// its pick chain.
		{"no affinity, both traffic policies Local", func(sp *proxy.ServicePort) { sp.AffinityTimeout = 0 },
			[]string{"chain local-demo/shape/tcp/http", "goto local-demo/shape/tcp/http", "chain pick-local-demo/shape/tcp/http"}},
		{"externalTrafficPolicy Local alone", func(sp *proxy.ServicePort) { sp.InternalPolicyLocal = false },
			[]string{"jump pick-local-demo/shape/tcp/http comment \"demo/shape:http\"\n\t\tgoto endpoint-dnat",
				"jump pick-svc-demo/shape/tcp/http comment \"demo/shape:http\"\n\t\tip saddr @cluster-cidrs goto cluster-dnat"}},
		{"back to a plain ClusterIP", func(sp *proxy.ServicePort) {
			*sp = proxy.ServicePort{Name: sp.Name, Type: v1.ServiceTypeClusterIP, ClusterIPs: sp.ClusterIPs, Port: sp.Port, Protocol: sp.Protocol}
		}, []string{"10.96.0.20 . tcp . 80 comment \"demo/shape:http\" : 0x01"}},
	}
	for _, st := range steps {
		sp := *w.Services[name]
		st.change(&sp)
		w.Services[name] = &sp
		w.Changed[name] = struct{}{}
		if st.what == "internalTrafficPolicy Local" {
			w.Endpoints[name] = local(w.Endpoints[name][0])
		}
		if err := b.Sync(context.Background(), w.Next()); err != nil {
			t.Fatalf("%s: %v", st.what, err)
		}
		listing := nftIn(t, ns, "list", "ruleset")
		for _, want := range st.want {
			if !strings.Contains(listing, want) {
				t.Errorf("%s: ruleset lacks %q:\n%s", st.what, want, listing)
			}
		}
		// The ClusterIP is in service-slots exactly when the shared
		// chains pick its endpoint (no session affinity, internal
		// policy Cluster; one endpoint here), and then has no verdict
		// of its own.
		slots := strings.Contains(nftIn(t, ns, "list", "map", "ip", TableName, mapServiceSlots), "10.96.0.20 . tcp . 80")
		verdict := strings.Contains(nftIn(t, ns, "list", "map", "ip", TableName, mapServiceIPs), "10.96.0.20 . tcp . 80")
		if want := sp.AffinityTimeout == 0 && !sp.InternalPolicyLocal; slots != want || verdict == want {
			t.Errorf("%s: ClusterIP in service-slots %t, in service-ips %t, want %t and %t", st.what, slots, verdict, want, !want)
		}
		// The Cluster policy's own pick chain only for external traffic.
		if own := strings.Contains(listing, "chain pick-svc-demo/shape/"); own && !sp.HasExternal() {
			t.Errorf("%s: a pick chain of the Service's own without external traffic:\n%s", st.what, listing)
		}
		if sp.AffinityTimeout == 0 && strings.Contains(listing, "chain svc-demo/shape/") {
			t.Errorf("%s: a svc- chain without session affinity:\n%s", st.what, listing)
		}
		if sp.AffinityTimeout == 0 && !sp.InternalPolicyLocal && strings.Contains(listing, "chain local-demo/shape/") {
			t.Errorf("%s: a local- chain the ClusterIPs do not go to, without session affinity:\n%s", st.what, listing)
		}
	}
	w.Remove(name)
	mustSync(t, b, w.Next())
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
	ns, _, b := kernelBackend(t)
	w := newWorld()
	const services, endpoints = 2000, 10
	for i := 0; i < services; i++ {
		eps := make([]string, endpoints)
		for j := range eps {
			eps[j] = fmt.Sprintf("10.244.%d.%d:8080", i/25, (i%25)*10+j)
		}
		w.AddService(statetest.PortName("demo", fmt.Sprintf("svc-%d", i), "http", v1.ProtocolTCP),
			fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), 80, int32(30000+i), eps...)
	}
	mustSync(t, b, w.Next())
	// Per Service: its external chain, pick chain and their rules (a
	// ClusterIP alone has no chain of its own), and elements (grouped).
	if ops := b.LastTransactionOps(); ops < 2*services {
		t.Fatalf("the full sync sent %d operations; the test needs one beyond the default buffers", ops)
	}
	listing := nftIn(t, ns, "list", "map", "ip", TableName, mapServiceSlots)
	if got := strings.Count(listing, " . tcp . 80 "); got != services {
		t.Errorf("service-slots holds %d of %d Services", got, services)
	}
}

// TestKernelSetsDoNotGrowWithServices keeps the table's sets, anonymous
// ones included, independent of the number of Services. The kernel finds
// sets by walking the table's list of them (to name a new anonymous set, to
// look one up by name, and for every jump or goto it checks for loops), so
// one set per Service makes a full sync quadratic: upstream's per-service
// "numgen vmap" took kp 433 s at 10,000 Services.
func TestKernelSetsDoNotGrowWithServices(t *testing.T) {
	_, fd, b := kernelBackend(t)
	conn, err := nftables.New(nftables.WithNetNSFd(fd))
	if err != nil {
		t.Fatal(err)
	}
	sets := func() int {
		t.Helper()
		ss, err := conn.GetSets(&nftables.Table{Name: TableName, Family: nftables.TableFamilyIPv4})
		if err != nil {
			t.Fatal(err)
		}
		return len(ss)
	}
	w := newWorld()
	w.AddService(statetest.PortName("ns", "svc0", "p", v1.ProtocolTCP), "10.96.0.1", 80, 30000, "10.244.0.1:80", "10.244.0.2:80")
	mustSync(t, b, w.Next())
	one := sets()
	for i := 1; i < 100; i++ {
		w.AddService(statetest.PortName("ns", fmt.Sprintf("svc%d", i), "p", v1.ProtocolTCP), fmt.Sprintf("10.96.0.%d", i+1), 80, int32(30000+i),
			fmt.Sprintf("10.244.%d.1:80", i), fmt.Sprintf("10.244.%d.2:80", i), fmt.Sprintf("10.244.%d.3:80", i))
	}
	mustSync(t, b, w.Next())
	if hundred := sets(); hundred != one {
		t.Errorf("%d sets in the table with 1 Service, %d with 100: per-service sets make syncs quadratic", one, hundred)
	}
}

// TestKernelRefusedBatchNamesTheOperationAndAppliesNothing: kp asks the
// kernel to acknowledge only the last message of a batch, so a failure in
// the middle must still come back, name what failed, and leave the kernel
// as it was.
func TestKernelRefusedBatchNamesTheOperationAndAppliesNothing(t *testing.T) {
	ns, fd := testNetns(t)
	c := &netlinkConn{nsFd: fd}
	f := families[0]
	ok := &Chain{Name: "fine"}
	tx := &Transaction{}
	tx.addTable(f)
	tx.addChain(f, ok)
	tx.addRule(f, &Chain{Name: "missing"}, &Rule{Text: "accept"})
	tx.addChain(f, &Chain{Name: "after"})
	err := c.Apply(tx)
	if err == nil {
		t.Fatal("the kernel accepted a rule in a chain that does not exist")
	}
	t.Log(err)
	for _, want := range []string{"operation 3 of 4", "add rule ip kp missing accept", "no such file or directory"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if out, _ := exec.Command("ip", "netns", "exec", ns, "nft", "list", "tables").CombinedOutput(); strings.Contains(string(out), TableName) {
		t.Errorf("a refused batch left part of itself behind:\n%s", out)
	}

	// The same batch without the bad operation applies.
	tx.ops = append(tx.ops[:2], tx.ops[3])
	if err := c.Apply(tx); err != nil {
		t.Fatal(err)
	}
	if out := nftIn(t, ns, "list", "chains"); !strings.Contains(out, "chain after") {
		t.Errorf("the last operation of an applied batch is missing:\n%s", out)
	}
}

// TestKernelCountersSurviveAChangeToOtherEndpoints: an endpoint's count of
// new connections lives in its rules, which a change to the Service
// rewrites; the new rules start from the old counts.
// TestKernelFullSyncReplacesTheEarlierLayout: kp before this version
// picked endpoints through a per-service anonymous numgen vmap into
// endpoint chains with named counters. A kp upgraded in place must remove
// all of it in its first sync, and leave the table as a fresh kp writes it.
func TestKernelFullSyncReplacesTheEarlierLayout(t *testing.T) {
	ns, _, b := kernelBackend(t) // it reads the kernel at its first sync
	w := newWorld()
	web := statetest.PortName("demo", "web", "http", v1.ProtocolTCP)
	w.AddService(web, "10.96.0.10", 80, 0, "10.244.1.2:8080", "10.244.1.3:8080")
	// What a fresh kp writes, for comparison.
	fresh, _, b0 := kernelBackend(t)
	mustSync(t, b0, w.Next())
	want := nftIn(t, fresh, "list", "ruleset")

	old := t.TempDir() + "/old.nft"
	script := `table ip kp {
	counter ep-demo/web/tcp/http__10.244.1.2/8080 {
	}
	counter ep-demo/web/tcp/http__10.244.1.3/8080 {
	}
	chain ep-demo/web/tcp/http__10.244.1.2/8080 {
		ip saddr 10.244.1.2 meta mark set meta mark | 0x4000
		counter name "ep-demo/web/tcp/http__10.244.1.2/8080" meta l4proto tcp dnat to 10.244.1.2:8080
	}
	chain ep-demo/web/tcp/http__10.244.1.3/8080 {
		counter name "ep-demo/web/tcp/http__10.244.1.3/8080" meta l4proto tcp dnat to 10.244.1.3:8080
	}
	chain svc-demo/web/tcp/http {
		numgen random mod 2 vmap { 0 : goto ep-demo/web/tcp/http__10.244.1.2/8080, 1 : goto ep-demo/web/tcp/http__10.244.1.3/8080 }
	}
}
`
	if err := os.WriteFile(old, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	nftIn(t, ns, "-f", old)
	mustSync(t, b, w.Next())
	// The same objects (a listing's order is the order of creation).
	if got := nftIn(t, ns, "list", "ruleset"); !slices.Equal(sortedLines(got), sortedLines(want)) {
		t.Errorf("after the first sync over the earlier layout:\n%s\nwant what a fresh kp writes:\n%s", got, want)
	}
}

func sortedLines(s string) []string {
	lines := strings.Split(s, "\n")
	for i := range lines {
		lines[i] = strings.TrimSpace(lines[i])
	}
	slices.Sort(lines)
	return lines
}

// requireReloads checks that an nft listing of kp's ruleset loads back with
// the nft CLI, into a fresh namespace, and lists there the same: the listing
// is a faithful, parseable description (operators debug with it).
func requireReloads(t *testing.T, listing string) {
	t.Helper()
	ns, _ := testNetns(t)
	path := t.TempDir() + "/ruleset.nft"
	if err := os.WriteFile(path, []byte(listing), 0o644); err != nil {
		t.Fatal(err)
	}
	nftIn(t, ns, "-f", path)
	if reloaded := nftIn(t, ns, "list", "ruleset"); reloaded != listing {
		t.Errorf("the listing does not reload to itself:\n--- kp wrote ---\n%s\n--- reloaded ---\n%s", listing, reloaded)
	}
}

// A firewall set of several ranges, one of them a single address: its
// elements once went to the kernel with every interval end after every
// start, which the interval set refused (EEXIST), failing the whole sync.
func TestKernelLoadBalancerWithSeveralSourceRangesLoads(t *testing.T) {
	_, _, b := kernelBackend(t)
	w := newWorld()
	n := statetest.PortName("e2e", "legacy", "http", v1.ProtocolTCP)
	w.AddService(n, "10.96.0.73", 80, 30080, "10.244.1.2:8080")
	st := w.Next()
	sp := st.Services[n]
	sp.Type = v1.ServiceTypeLoadBalancer
	sp.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("10.96.200.3")}
	sp.ExternalIPs = []netip.Addr{netip.MustParseAddr("10.96.201.3")}
	sp.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("10.129.2.2/32"), netip.MustParsePrefix("10.255.1.7/24")}
	if err := b.Sync(context.Background(), st); err != nil {
		t.Fatal(err)
	}
}
