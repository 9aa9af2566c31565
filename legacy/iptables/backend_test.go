package iptables

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

// newWorld is the iptables tests' World: the node "node-1" at
// 192.168.0.10; an endpoint is on node-1 when its address ends in .1 or .2,
// else on node-2; a service port with a nodePort is of type NodePort.
func newWorld() *statetest.World {
	return statetest.New(statetest.Node("node-1", "192.168.0.10"), statetest.PlaceEndpoints(nodeOf), statetest.NodePortType())
}

// nodeOf is node-1 for an address ending in .1 or .2, else node-2.
func nodeOf(a netip.Addr) string {
	if last := a.As4()[3]; last == 1 || last == 2 {
		return "node-1"
	}
	return "node-2"
}

func testConfig() proxy.Config {
	return proxy.Config{Mode: proxy.ModeIPTables, MasqueradeBit: 14,
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, LocalhostNodePorts: true}
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// newClock is the tests' clock, stopped at a fixed time.
func newClock() *clock { return &clock{t: time.Date(2026, 11, 23, 15, 0, 0, 0, time.UTC)} }

func fakeBackend(t *testing.T, cfg proxy.Config) (*Backend, *Fake, *clock) {
	t.Helper()
	fk := NewFake(FlavorNFT, proxy.IPv4)
	c := newClock()
	// Staging off: these tests read a full sync as one input; stage_test.go
	// tests the staged cold start.
	b, err := New(cfg, nil, WithRunners(fk), WithClock(c.now), WithRouteLocalnet(func() error { return nil }),
		WithLocalAddrs(func() ([]netip.Addr, error) { return nil, nil }), WithStaging(0))
	if err != nil {
		t.Fatal(err)
	}
	return b, fk, c
}

func mustSync(t *testing.T, b *Backend, st *proxy.State) {
	t.Helper()
	if err := b.Sync(context.Background(), st); err != nil {
		t.Fatal(err)
	}
}

// featureWorld has one service port of each kind the renderer knows.
func featureWorld() *statetest.World {
	w := newWorld()
	w.AddService(statetest.PortName("demo", "web", "http", v1.ProtocolTCP), "10.96.0.10", 80, 30080, "10.244.1.1:8080", "10.244.2.3:8080")
	w.AddService(statetest.PortName("demo", "empty", "", v1.ProtocolTCP), "10.96.0.11", 53, 0)
	lb := w.AddService(statetest.PortName("demo", "lb", "https", v1.ProtocolTCP), "10.96.0.12", 443, 30443, "10.244.1.2:8443", "10.244.2.4:8443")
	lb.Type = v1.ServiceTypeLoadBalancer
	lb.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("203.0.113.7")}
	lb.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
	lb.ExternalPolicyLocal = true
	lb.HealthCheckNodePort = 32000
	sticky := w.AddService(statetest.PortName("demo", "sticky", "", v1.ProtocolTCP), "10.96.0.13", 8080, 0, "10.244.2.5:80")
	sticky.AffinityTimeout = 3 * time.Hour
	sticky.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.51.100.50")}
	itp := w.AddService(statetest.PortName("demo", "itp", "", v1.ProtocolTCP), "10.96.0.14", 80, 0, "10.244.2.6:80")
	itp.InternalPolicyLocal = true
	udp := statetest.PortName("kube-system", "dns", "dns", v1.ProtocolUDP)
	w.AddService(udp, "10.96.0.15", 53, 0, "10.244.1.1:53")
	sctp := statetest.PortName("demo", "sctp", "", v1.ProtocolSCTP)
	w.AddService(sctp, "10.96.0.16", 9000, 30900, "10.244.2.7:9000")
	w.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}
	return w
}

func TestFirstSyncWritesEveryFeatureAsGolden(t *testing.T) {
	b, fk, _ := fakeBackend(t, testConfig())
	mustSync(t, b, featureWorld().Next())
	if !b.LastSyncFull() {
		t.Error("the first sync is not full")
	}
	got := string(fk.Inputs[0])
	golden := "testdata/render-golden.txt"
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("restore input differs from %s (go test -update to accept):\n%s", golden, got)
	}
}

func TestRenderFollowsUpstreamSemantics(t *testing.T) {
	b, fk, _ := fakeBackend(t, testConfig())
	w := featureWorld()
	mustSync(t, b, w.Next())
	in := string(fk.Inputs[0])
	web := w.Services[statetest.PortName("demo", "web", "http", v1.ProtocolTCP)]
	lb := w.Services[statetest.PortName("demo", "lb", "https", v1.ProtocolTCP)]
	sticky := w.Services[statetest.PortName("demo", "sticky", "", v1.ProtocolTCP)]
	for _, c := range []struct{ what, line string }{
		{"ClusterIP to KP-SVC", `-m comment --comment "demo/web:http cluster IP" -m tcp -p tcp -d 10.96.0.10 --dport 80 -j ` + svcChainName(web)},
		{"off-cluster ClusterIP traffic masqueraded", `-d 10.96.0.10 --dport 80 ! -s 10.244.0.0/16 -j KP-MARK-MASQ`},
		{"endpoints picked uniformly", `-m statistic --mode random --probability 0.5000000000 -j KP-SEP-`},
		{"hairpin", `-A ` + sepChainName(web, w.Endpoints[web.Name][0]) + ` -m comment --comment "demo/web:http" -s 10.244.1.1 -j KP-MARK-MASQ`},
		{"DNAT", `-m tcp -p tcp -j DNAT --to-destination 10.244.1.1:8080`},
		{"NodePort to KP-EXT", `-m tcp -p tcp --dport 30080 -j ` + extChainName(web)},
		{"ETP Cluster masquerades", `-A ` + extChainName(web) + ` -m comment --comment "masquerade traffic for demo/web:http external destinations" -j KP-MARK-MASQ`},
		{"no endpoints rejected", `-A KP-SERVICES -m comment --comment "demo/empty has no endpoints" -m tcp -p tcp -d 10.96.0.11 --dport 53 -j REJECT`},
		{"other ports of a ClusterIP rejected", `--comment "demo/web:http cluster IP: other ports" -d 10.96.0.10 -j REJECT`},
		{"unallocated service addresses dropped", `-d 10.96.0.0/16 -j DROP`},
		{"LB IP through the firewall chain", `-d 203.0.113.7 --dport 443 -j ` + fwChainName(lb)},
		{"source range allowed", `-A ` + fwChainName(lb) + ` -m comment --comment "demo/lb:https loadbalancer IP" -s 198.51.100.0/24 -j ` + extChainName(lb)},
		{"others dropped in filter", `-A KP-PROXY-FIREWALL -m comment --comment "demo/lb:https traffic not accepted by ` + fwChainName(lb) + `" -m tcp -p tcp -d 203.0.113.7 --dport 443 -j DROP`},
		{"ETP Local: pods reach every endpoint", `-s 10.244.0.0/16 -j ` + svcChainName(lb)},
		{"ETP Local: the node too, masqueraded", `-m addrtype --src-type LOCAL -j KP-MARK-MASQ`},
		{"ETP Local: the rest to local endpoints", `-A ` + extChainName(lb) + ` -m comment --comment "demo/lb:https" -j ` + svlChainName(lb)},
		{"health check node port accepted", `--dport 32000 -j ACCEPT`},
		{"affinity checked", `-m recent --name ` + sepChainName(sticky, w.Endpoints[sticky.Name][0]) + ` --rcheck --seconds 10800 --reap`},
		{"affinity set", `-m recent --name ` + sepChainName(sticky, w.Endpoints[sticky.Name][0]) + ` --set -m tcp -p tcp -j DNAT`},
		{"external IP", `"demo/sticky external IP" -m tcp -p tcp -d 198.51.100.50 --dport 8080 -j KP-EXT-`},
		{"ITP Local without local endpoints dropped", `"demo/itp has no local endpoints" -m tcp -p tcp -d 10.96.0.14 --dport 80 -j DROP`},
		{"UDP", `-m udp -p udp -d 10.96.0.15 --dport 53`},
		{"SCTP", `-m sctp -p sctp --dport 30900`},
		{"NodePorts on every local address but localhost allowed", `-m addrtype --dst-type LOCAL -j KP-NODEPORTS`},
		{"masquerade with --random-fully", `-j MASQUERADE --random-fully`},
		{"forwarding of marked traffic", `-A KP-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT`},
		{"jump from PREROUTING", `-I PREROUTING 1 -m comment --comment "kubernetes service portals" -j KP-SERVICES`},
		{"jump from filter FORWARD", `-I FORWARD 1 -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KP-SERVICES`},
		{"localhost NodePorts firewall", `-A KP-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8`},
	} {
		if !strings.Contains(in, c.line) {
			t.Errorf("%s: no line with %q", c.what, c.line)
		}
	}
	if n := len(svcChainName(web)); n > 28 {
		t.Errorf("chain name %s is %d characters", svcChainName(web), n)
	}
}

func TestPartialSyncWritesOnlyTheChangedServicesChains(t *testing.T) {
	b, fk, c := fakeBackend(t, testConfig())
	w := featureWorld()
	mustSync(t, b, w.Next())
	web := statetest.PortName("demo", "web", "http", v1.ProtocolTCP)
	w.SetEndpoints(web, "10.244.1.1:8080", "10.244.2.9:8080")
	mustSync(t, b, w.Next())
	if b.LastSyncFull() {
		t.Error("a sync after a successful one was full")
	}
	in := string(fk.Inputs[1])
	sp := w.Services[web]
	for _, want := range []string{":" + svcChainName(sp) + " ", "-X " + sepChainName(sp, proxy.Endpoint{IP: netip.MustParseAddr("10.244.2.3"), Port: 8080}),
		"--to-destination 10.244.2.9:8080"} {
		if !strings.Contains(in, want) {
			t.Errorf("partial input lacks %q:\n%s", want, in)
		}
	}
	for _, other := range []string{"demo/lb", "demo/sticky", "KP-POSTROUTING", "-I "} {
		if strings.Contains(in, other) {
			t.Errorf("partial input rewrites %q:\n%s", other, in)
		}
	}
	// Nothing changed: nothing sent.
	mustSync(t, b, w.Next())
	if len(fk.Inputs) != 2 {
		t.Errorf("a sync with no change sent input:\n%s", fk.Inputs[len(fk.Inputs)-1])
	}
	// The Node changed: full.
	st := w.Next()
	st.NodeChanged = true
	mustSync(t, b, st)
	if !b.LastSyncFull() {
		t.Error("a Node change did not make the sync full")
	}
	// An hour later: full, without duplicating the jumps.
	c.t = c.t.Add(61 * time.Minute)
	mustSync(t, b, w.Next())
	if !b.LastSyncFull() {
		t.Error("no full sync after an hour")
	}
	if n := strings.Count(fk.Dump(TableNAT), "PREROUTING: "); n != 1 {
		t.Errorf("PREROUTING has %d rules, want 1 jump:\n%s", n, fk.Dump(TableNAT))
	}
}

func TestRemovedServiceAndStaleChainsAreDeleted(t *testing.T) {
	b, fk, _ := fakeBackend(t, testConfig())
	// A chain of an earlier run that nothing wants any more.
	if err := fk.Restore(context.Background(), []byte("*nat\n:KP-SVC-OLDOLDOLDOLDOLD - [0:0]\n-A KP-SVC-OLDOLDOLDOLDOLD -j RETURN\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	w := featureWorld()
	mustSync(t, b, w.Next())
	if fk.Tables[TableNAT].has("KP-SVC-OLDOLDOLDOLDOLD") {
		t.Error("the full sync left a stale KP- chain")
	}
	web := statetest.PortName("demo", "web", "http", v1.ProtocolTCP)
	sp := w.Services[web]
	delete(w.Services, web)
	delete(w.Endpoints, web)
	w.Changed[web] = struct{}{}
	mustSync(t, b, w.Next())
	for _, name := range []string{svcChainName(sp), extChainName(sp)} {
		if fk.Tables[TableNAT].has(name) {
			t.Errorf("%s is left after its service was deleted", name)
		}
	}
	if strings.Contains(fk.Dump(TableNAT), "demo/web") || strings.Contains(fk.Dump(TableFilter), "demo/web") {
		t.Errorf("rules of the deleted service are left:\n%s", fk.Dump(TableNAT))
	}
}

func TestRefusedBatchNamesTheServiceAndForcesAFullSync(t *testing.T) {
	b, fk, _ := fakeBackend(t, testConfig())
	w := featureWorld()
	mustSync(t, b, w.Next())
	before := fk.Dump(TableNAT)
	sticky := statetest.PortName("demo", "sticky", "", v1.ProtocolTCP)
	w.SetEndpoints(sticky, "10.244.2.66:80")
	fk.Refuse = "10.244.2.66"
	err := b.Sync(context.Background(), w.Next())
	if err == nil || !strings.Contains(err.Error(), "demo/sticky") {
		t.Fatalf("error %v does not name demo/sticky", err)
	}
	if fk.Dump(TableNAT) != before {
		t.Error("the refused nat block was half applied")
	}
	if n := testutil.ToFloat64(b.metrics.partialRestoreFailures.WithLabelValues("IPv4")); n != 1 {
		t.Errorf("kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total = %v, want 1", n)
	}
	fk.Refuse = ""
	mustSync(t, b, w.Next())
	if !b.LastSyncFull() {
		t.Error("the sync after a failure was not full")
	}
	if !strings.Contains(fk.Dump(TableNAT), "10.244.2.66:80") {
		t.Error("the full sync did not apply the change")
	}
}

func TestEndpointCountersReadTheDNATRules(t *testing.T) {
	b, fk, _ := fakeBackend(t, testConfig())
	w := featureWorld()
	mustSync(t, b, w.Next())
	web := w.Services[statetest.PortName("demo", "web", "http", v1.ProtocolTCP)]
	ep := w.Endpoints[web.Name][0]
	nat := fk.Tables[TableNAT]
	nat.Counters = map[string][]SavedRule{sepChainName(web, ep): {{Packets: 100}, {Packets: 3, Bytes: 180}}}
	got, err := b.EndpointCounters(&w.State)
	if err != nil {
		t.Fatal(err)
	}
	want := proxy.EndpointCounter{Packets: 3, Bytes: 180}
	if c := got[proxy.EndpointRef{ServicePort: web.Name, Endpoint: ep.AddrPort()}]; c != want {
		t.Errorf("counter %+v, want %+v (the DNAT rule's, not the hairpin rule's)", c, want)
	}
}

func TestEndpointCounterReadsAreSharedForASecond(t *testing.T) {
	b, fk, clk := fakeBackend(t, testConfig())
	w := featureWorld()
	mustSync(t, b, w.Next())
	web := w.Services[statetest.PortName("demo", "web", "http", v1.ProtocolTCP)]
	ep := w.Endpoints[web.Name][0]
	ref := proxy.EndpointRef{ServicePort: web.Name, Endpoint: ep.AddrPort()}
	nat := fk.Tables[TableNAT]
	count := func(packets uint64) uint64 {
		t.Helper()
		nat.Counters = map[string][]SavedRule{sepChainName(web, ep): {{Packets: 0}, {Packets: packets}}}
		got, err := b.EndpointCounters(&w.State)
		if err != nil {
			t.Fatal(err)
		}
		return got[ref].Packets
	}
	if got := count(1); got != 1 {
		t.Fatalf("first read: %d packets, want 1", got)
	}
	clk.t = clk.t.Add(countersMaxAge / 2)
	if got := count(2); got != 1 {
		t.Errorf("a read within %v ran iptables-save again: %d packets, want the shared 1", countersMaxAge, got)
	}
	clk.t = clk.t.Add(countersMaxAge)
	if got := count(3); got != 3 {
		t.Errorf("a read after %v: %d packets, want a fresh 3", countersMaxAge, got)
	}
}

func TestNodePortAddressesFollowTheConfig(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  func(*proxy.Config)
		want []string
		not  []string
	}{
		{"every local address, localhost too", func(*proxy.Config) {}, []string{"-m addrtype --dst-type LOCAL -j KP-NODEPORTS"}, nil},
		{"no localhost", func(c *proxy.Config) { c.LocalhostNodePorts = false },
			[]string{"-m addrtype --dst-type LOCAL ! -d 127.0.0.0/8 -j KP-NODEPORTS"}, []string{"KP-FIREWALL"}},
		{"primary", func(c *proxy.Config) { c.NodePortPrimary = true }, []string{"-d 192.168.0.10 -j KP-NODEPORTS"}, []string{"addrtype --dst-type LOCAL -j KP-NODEPORTS"}},
		{"every address by /0", func(c *proxy.Config) {
			c.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}
		}, []string{"-m addrtype --dst-type LOCAL -j KP-NODEPORTS"}, []string{"-d 192.168.0.10 -j KP-NODEPORTS"}},
		{"CIDRs", func(c *proxy.Config) { c.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("192.168.0.0/24")} },
			[]string{"-d 192.168.0.10 -j KP-NODEPORTS"}, []string{"-d 10.0.0.1 -j KP-NODEPORTS", "KP-FIREWALL"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig()
			c.cfg(&cfg)
			b, fk, _ := fakeBackend(t, cfg)
			b.localAddrs = func() ([]netip.Addr, error) {
				return []netip.Addr{netip.MustParseAddr("192.168.0.10"), netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("127.0.0.1")}, nil
			}
			mustSync(t, b, featureWorld().Next())
			in := string(fk.Inputs[0])
			for _, w := range c.want {
				if !strings.Contains(in, w) {
					t.Errorf("no %q", w)
				}
			}
			for _, w := range c.not {
				if strings.Contains(in, w) {
					t.Errorf("unexpected %q", w)
				}
			}
		})
	}
}

func TestDualStackRendersEachFamilyFromTheSameState(t *testing.T) {
	v4, v6 := NewFake(FlavorLegacy, proxy.IPv4), NewFake(FlavorLegacy, proxy.IPv6)
	cfg := testConfig()
	cfg.ClusterCIDRs = append(cfg.ClusterCIDRs, netip.MustParsePrefix("fd00:10:244::/56"))
	b, err := New(cfg, nil, WithRunners(v4, v6), WithRouteLocalnet(func() error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld()
	sp := w.AddService(statetest.PortName("demo", "dual", "", v1.ProtocolTCP), "10.96.0.20", 80, 30020, "10.244.1.1:80")
	sp.ClusterIPs = append(sp.ClusterIPs, netip.MustParseAddr("fd00:96::20"))
	w.Endpoints[sp.Name] = append(w.Endpoints[sp.Name], proxy.Endpoint{IP: netip.MustParseAddr("fd00:10:244::1"), Port: 80, Ready: true}.At("node-1", ""))
	mustSync(t, b, w.Next())
	in4, in6 := string(v4.Inputs[0]), string(v6.Inputs[0])
	if !strings.Contains(in4, "-d 10.96.0.20") || strings.Contains(in4, "fd00") {
		t.Errorf("IPv4 input:\n%s", in4)
	}
	if !strings.Contains(in6, "-d fd00:96::20") || !strings.Contains(in6, "--to-destination [fd00:10:244::1]:80") ||
		strings.Contains(in6, "10.96.0.20") || !strings.Contains(in6, "! -d ::1/128") || strings.Contains(in6, "KP-FIREWALL") {
		t.Errorf("IPv6 input:\n%s", in6)
	}
}

func ExampleBackend_render() {
	w := newWorld()
	w.AddService(statetest.PortName("demo", "web", "", v1.ProtocolTCP), "10.96.0.10", 80, 0, "10.244.1.1:8080")
	b, _ := New(testConfig(), nil)
	r := b.render(proxy.IPv4, w.Services[statetest.PortName("demo", "web", "", v1.ProtocolTCP)], w.Endpoints[statetest.PortName("demo", "web", "", v1.ProtocolTCP)], w.Node)
	for _, c := range r.chains {
		for _, rl := range c.Rules {
			fmt.Println(rl.line(c.Name))
		}
	}
	// Output:
	// -A KP-SVC-YTGZ2JEENUBCE3T3 -m comment --comment "demo/web cluster IP" -m tcp -p tcp -d 10.96.0.10 --dport 80 ! -s 10.244.0.0/16 -j KP-MARK-MASQ
	// -A KP-SVC-YTGZ2JEENUBCE3T3 -m comment --comment "demo/web -> 10.244.1.1:8080" -j KP-SEP-WGWJBNOFIK4VIVEK
	// -A KP-SEP-WGWJBNOFIK4VIVEK -m comment --comment "demo/web" -s 10.244.1.1 -j KP-MARK-MASQ
	// -A KP-SEP-WGWJBNOFIK4VIVEK -m comment --comment "demo/web" -m tcp -p tcp -j DNAT --to-destination 10.244.1.1:8080
}
