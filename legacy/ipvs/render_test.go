package ipvs

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/ipvs"
	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/legacy/iptables"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/proxytest"
	"github.com/kpproxy/kp/proxy/statetest"
)

// summary prints servers and entries in a stable, readable form.
func summary(r *rendered) string {
	var lines []string
	for _, vs := range r.servers {
		var ds []string
		for _, d := range vs.Dests {
			ds = append(ds, d.String())
		}
		lines = append(lines, vs.Key.String()+" "+vs.Scheduler+" t="+strconv.Itoa(int(vs.Timeout))+" ["+strings.Join(ds, " ")+"]")
	}
	for _, a := range r.addrs {
		lines = append(lines, "addr "+a.String())
	}
	for _, e := range r.entries {
		lines = append(lines, "set "+string(e.Kind)+" "+e.Entry)
	}
	return strings.Join(lines, "\n")
}

func TestRenderFollowsUpstreamsLayout(t *testing.T) {
	node := proxy.Node{Name: "n1", IPs: proxytest.Addrs("192.168.0.2")}
	in := renderInput{family: proxy.IPv4, scheduler: "rr", node: node, nodeAddrs: proxytest.Addrs("192.168.0.2")}
	eps := []proxy.Endpoint{statetest.Endpoint("10.244.0.2:8080", statetest.On("n1", "")), statetest.Endpoint("10.244.1.2:8080", statetest.On("n2", ""))}
	for _, tc := range []struct {
		name string
		sp   proxy.ServicePort
		want []string // lines the summary holds
		not  []string // lines it must not hold
	}{{
		name: "ClusterIP: a server per ClusterIP, bound to kp-ipvs0, in KP-CLUSTER-IP",
		sp:   proxy.ServicePort{Name: statetest.PortName("ns", "a", "", v1.ProtocolTCP), ClusterIPs: proxytest.Addrs("10.96.0.10", "fd00::10"), Port: 80, Protocol: v1.ProtocolTCP},
		want: []string{"tcp/10.96.0.10:80 rr t=0 [10.244.0.2:8080 10.244.1.2:8080]", "addr 10.96.0.10",
			"set CLUSTER-IP 10.96.0.10,tcp:80", "set IPVS-IPS 10.96.0.10", "set IPVS-SERVERS 10.96.0.10,tcp:80",
			"set LOOP-BACK 10.244.0.2,tcp:8080,10.244.0.2"},
		// Hairpin is for this node's pods only (upstream's KUBE-LOOP-BACK).
		not: []string{"fd00::10", "set LOOP-BACK 10.244.1.2"},
	}, {
		name: "ClientIP affinity is IPVS persistence with the Service's timeout",
		sp:   proxy.ServicePort{Name: statetest.PortName("ns", "a", "", v1.ProtocolTCP), ClusterIPs: proxytest.Addrs("10.96.0.10"), Port: 80, Protocol: v1.ProtocolTCP, AffinityTimeout: 3 * time.Hour},
		want: []string{"tcp/10.96.0.10:80 rr t=10800 [10.244.0.2:8080 10.244.1.2:8080]"},
	}, {
		name: "NodePort with Local policy: node addresses get local endpoints, the ClusterIP all",
		sp: proxy.ServicePort{Name: statetest.PortName("ns", "a", "", v1.ProtocolTCP), ClusterIPs: proxytest.Addrs("10.96.0.10"), Port: 80, Protocol: v1.ProtocolTCP,
			NodePort: 30080, ExternalPolicyLocal: true, HealthCheckNodePort: 31000},
		want: []string{"tcp/10.96.0.10:80 rr t=0 [10.244.0.2:8080 10.244.1.2:8080]", "tcp/192.168.0.2:30080 rr t=0 [10.244.0.2:8080]",
			"set NODE-PORT-TCP 30080", "set NODE-PORT-LOCAL-TCP 30080", "set HEALTH-CHECK-NODE-PORT 31000", "set IPVS-SERVERS 192.168.0.2,tcp:30080"},
		not: []string{"addr 192.168.0.2"},
	}, {
		name: "internalTrafficPolicy Local narrows the ClusterIP server",
		sp:   proxy.ServicePort{Name: statetest.PortName("ns", "a", "", v1.ProtocolTCP), ClusterIPs: proxytest.Addrs("10.96.0.10"), Port: 80, Protocol: v1.ProtocolTCP, InternalPolicyLocal: true},
		want: []string{"tcp/10.96.0.10:80 rr t=0 [10.244.0.2:8080]"},
	}, {
		name: "LoadBalancer with source ranges and externalIPs",
		sp: proxy.ServicePort{Name: statetest.PortName("ns", "a", "", v1.ProtocolTCP), ClusterIPs: proxytest.Addrs("10.96.0.10"), Port: 443, Protocol: v1.ProtocolUDP,
			ExternalIPs: proxytest.Addrs("203.0.113.5"), LoadBalancerIPs: proxytest.Addrs("198.51.100.7"),
			LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("172.16.0.0/12")}},
		want: []string{"udp/198.51.100.7:443 rr t=0 [10.244.0.2:8080 10.244.1.2:8080]", "addr 203.0.113.5", "addr 198.51.100.7",
			"set EXTERNAL-IP 203.0.113.5,udp:443", "set LOAD-BALANCER 198.51.100.7,udp:443", "set LOAD-BALANCER-FW 198.51.100.7,udp:443",
			"set LOAD-BALANCER-SOURCE-CIDR 198.51.100.7,udp:443,172.16.0.0/12", "set LOAD-BALANCER-SOURCE-IP 198.51.100.7,udp:443,10.244.0.2"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := summary(render(in, &tc.sp, eps))
			lines := strings.Split(got, "\n")
			for _, w := range tc.want {
				if !slices.Contains(lines, w) {
					t.Errorf("lacks %q:\n%s", w, got)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(got, n) {
					t.Errorf("holds %q:\n%s", n, got)
				}
			}
		})
	}
}

func TestRenderWithoutUsableEndpointsLeavesAServerWithNoRealServer(t *testing.T) {
	in := renderInput{family: proxy.IPv4, scheduler: "sh"}
	sp := proxy.ServicePort{Name: statetest.PortName("ns", "a", "", v1.ProtocolTCP), ClusterIPs: proxytest.Addrs("10.96.0.10"), Port: 80, Protocol: v1.ProtocolTCP}
	r := render(in, &sp, nil)
	if len(r.servers) != 1 || len(r.servers[0].Dests) != 0 || r.servers[0].Scheduler != "sh" {
		t.Fatalf("servers = %s", summary(r))
	}
}

func kdest(ap string, weight, active, inactive int) *ipvs.Destination {
	d := destination(netip.MustParseAddrPort(ap), weight)
	d.ActiveConnections, d.InactiveConnections = active, inactive
	return d
}

func TestDiffServerTouchesOnlyWhatChanged(t *testing.T) {
	key := vsKey{Proto: v1.ProtocolTCP, Addr: netip.MustParseAddr("10.96.0.10"), Port: 80}
	want := &VirtualServer{Key: key, Scheduler: "rr", Owner: statetest.PortName("ns", "a", "", v1.ProtocolTCP),
		Dests: []netip.AddrPort{netip.MustParseAddrPort("10.244.0.2:8080"), netip.MustParseAddrPort("10.244.0.3:8080")}}
	svc := want.service()
	for _, tc := range []struct {
		name string
		want *VirtualServer
		have *kernelServer
		ops  []string
	}{
		{"new server", want, nil, []string{"add virtual server tcp/10.96.0.10:80",
			"add real server tcp/10.96.0.10:80 -> 10.244.0.2:8080", "add real server tcp/10.96.0.10:80 -> 10.244.0.3:8080"}},
		{"nothing changed", want, &kernelServer{svc: svc, dests: []*ipvs.Destination{kdest("10.244.0.2:8080", 1, 0, 0), kdest("10.244.0.3:8080", 1, 3, 0)}}, nil},
		{"an endpoint added", want, &kernelServer{svc: svc, dests: []*ipvs.Destination{kdest("10.244.0.2:8080", 1, 0, 0)}},
			[]string{"add real server tcp/10.96.0.10:80 -> 10.244.0.3:8080"}},
		{"a removed endpoint with connections drains, one without goes", want, &kernelServer{svc: svc, dests: []*ipvs.Destination{
			kdest("10.244.0.2:8080", 1, 0, 0), kdest("10.244.0.3:8080", 1, 0, 0), kdest("10.244.0.4:8080", 1, 1, 0), kdest("10.244.0.5:8080", 1, 0, 0)}},
			[]string{"drain real server tcp/10.96.0.10:80 -> 10.244.0.4:8080", "delete real server tcp/10.96.0.10:80 -> 10.244.0.5:8080"}},
		{"a draining endpoint wanted again", want, &kernelServer{svc: svc, dests: []*ipvs.Destination{kdest("10.244.0.2:8080", 0, 2, 0), kdest("10.244.0.3:8080", 1, 0, 0)}},
			[]string{"restore real server tcp/10.96.0.10:80 -> 10.244.0.2:8080"}},
		{"the scheduler changed", &VirtualServer{Key: key, Scheduler: "sh", Dests: want.Dests},
			&kernelServer{svc: svc, dests: []*ipvs.Destination{kdest("10.244.0.2:8080", 1, 0, 0), kdest("10.244.0.3:8080", 1, 0, 0)}},
			[]string{"update virtual server tcp/10.96.0.10:80"}},
		{"the Service is gone", nil, &kernelServer{svc: svc}, []string{"delete virtual server tcp/10.96.0.10:80"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, o := range diffServer(key, tc.want, tc.have, statetest.PortName("ns", "a", "", v1.ProtocolTCP)) {
				got = append(got, o.String())
			}
			if !slices.Equal(got, tc.ops) {
				t.Errorf("ops:\n got %q\nwant %q", got, tc.ops)
			}
		})
	}
}

func TestUDPRealServersAreDeletedAtOnce(t *testing.T) {
	key := vsKey{Proto: v1.ProtocolUDP, Addr: netip.MustParseAddr("10.96.0.10"), Port: 53}
	want := &VirtualServer{Key: key, Scheduler: "rr"}
	ops := diffServer(key, want, &kernelServer{svc: want.service(), dests: []*ipvs.Destination{kdest("10.244.0.2:53", 1, 1, 1)}}, statetest.PortName("ns", "a", "", v1.ProtocolTCP))
	if len(ops) != 1 || ops[0].kind != opDelDest {
		t.Errorf("ops = %v, want one delete", ops)
	}
}

func TestWrittenCountsSharedAddressesAndEntries(t *testing.T) {
	in := renderInput{family: proxy.IPv4, scheduler: "rr", node: proxy.Node{Name: "n1"}}
	bk := newWritten()
	a := &proxy.ServicePort{Name: statetest.PortName("ns", "a", "", v1.ProtocolTCP), ClusterIPs: proxytest.Addrs("10.96.0.10"), Port: 80, Protocol: v1.ProtocolTCP}
	b := &proxy.ServicePort{Name: proxy.ServicePortName{NamespacedName: a.Name.NamespacedName, Port: "b", Protocol: v1.ProtocolTCP},
		ClusterIPs: proxytest.Addrs("10.96.0.10"), Port: 81, Protocol: v1.ProtocolTCP}
	eps := []proxy.Endpoint{statetest.Endpoint("10.244.0.2:8080", statetest.On("n1", ""))}
	bk.set(a.Name, render(in, a, eps), newChange())
	bk.set(b.Name, render(in, b, eps), newChange())

	c := newChange()
	bk.set(a.Name, nil, c)
	c.settle()
	if len(c.delAddrs) != 0 {
		t.Errorf("removing one port of two removed the shared ClusterIP: %v", c.delAddrs)
	}
	if _, ok := c.servers[vsKey{v1.ProtocolTCP, netip.MustParseAddr("10.96.0.10"), 80}]; !ok || len(c.servers) != 1 {
		t.Errorf("servers to reconcile = %v, want :80 only", c.servers)
	}

	c = newChange()
	bk.set(b.Name, render(in, b, append(eps, statetest.Endpoint("10.244.0.3:8080", statetest.On("n1", "")))), c)
	c.settle()
	if len(c.delEntries) != 0 || len(c.addEntries) != 1 || c.addEntries[0].Kind != setLoopBack {
		t.Errorf("an endpoint added: entries +%v -%v, want one loop-back entry added", c.addEntries, c.delEntries)
	}
}

func TestSetsInputSwapsFullAndEditsPartial(t *testing.T) {
	bk := newWritten()
	bk.entries[setEntry{setClusterIP, "10.96.0.10,tcp:80"}] = 1
	full := string(fullSetsInput(map[proxy.Family]*written{proxy.IPv4: bk}, []proxy.Family{proxy.IPv4}))
	for _, w := range []string{"create KP-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 1048576 -exist",
		"add KP-TMP-4-0 10.96.0.10,tcp:80 -exist", "swap KP-TMP-4-0 KP-CLUSTER-IP", "destroy KP-TMP-4-0",
		"create KP-NODE-PORT-TCP bitmap:port range 0-65535 -exist"} {
		if !strings.Contains(full, w+"\n") {
			t.Errorf("full input lacks %q", w)
		}
	}
	for _, n := range allSetNames() {
		if len(n) > 31 {
			t.Errorf("set name %s is longer than ipset's 31 characters", n)
		}
	}
	part := string(partialSetsInput(map[proxy.Family]*change{proxy.IPv6: {addEntries: []setEntry{{setClusterIP, "fd00::10,tcp:80"}},
		delEntries: []setEntry{{setLoopBack, "fd00::2,tcp:80,fd00::2"}}}}, []proxy.Family{proxy.IPv6}))
	if part != "del KP-6-LOOP-BACK fd00::2,tcp:80,fd00::2 -exist\nadd KP-6-CLUSTER-IP fd00::10,tcp:80 -exist\n" {
		t.Errorf("partial input = %q", part)
	}
}

func TestChainsUseKPIPVSNamesAndTheMarkBit(t *testing.T) {
	notLocal, _ := iptables.LocalMatch(proxy.Config{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}, proxy.IPv4, true)
	chains := renderChains(rulesInput{family: proxy.IPv4, masqMark: 0x4000, notLocal: notLocal})
	in := string(restoreInput(chains, nil))
	for _, w := range []string{
		"-A KP-IPVS-SERVICES -m comment --comment \"ClusterIPs from outside the cluster\" ! -s 10.244.0.0/16 -m set --match-set KP-CLUSTER-IP dst,dst -j KP-IPVS-MARK-MASQ",
		"-A KP-IPVS-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
		"-A KP-IPVS-MARK-MASQ -j MARK --or-mark 0x4000",
		"-I PREROUTING -m comment --comment \"kp ipvs service portals\" -j KP-IPVS-SERVICES",
		"-A KP-IPVS-FILTER -m comment --comment \"other ports of Service addresses\" -m conntrack --ctstate NEW -m set --match-set KP-IPVS-IPS dst -j REJECT",
	} {
		if !strings.Contains(in, w+"\n") {
			t.Errorf("restore input lacks %q:\n%s", w, in)
		}
	}
	for _, c := range chains {
		if !strings.HasPrefix(c.Name, "KP-IPVS-") || len(c.Name) > 28 {
			t.Errorf("chain %s: want KP-IPVS- and at most 28 characters", c.Name)
		}
	}
}

// The ClusterIPs' masquerade decision follows --detect-local-mode, as
// upstream's ipvs mode writes it (its local detector's IfNotLocal).
func TestClusterIPMasqueradeFollowsTheDetectLocalMode(t *testing.T) {
	for _, c := range []struct {
		name   string
		cfg    proxy.Config
		family proxy.Family
		match  string
	}{
		{"ClusterCIDR", proxy.Config{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}, proxy.IPv4,
			"! -s 10.244.0.0/16 -m set --match-set KP-CLUSTER-IP dst,dst -j KP-IPVS-MARK-MASQ"},
		{"NodeCIDR", proxy.Config{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
			DetectLocal: proxy.DetectLocal{Mode: proxy.LocalModeNodeCIDR, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("fd00:10:244:7::/64")}}},
			proxy.IPv6, "! -s fd00:10:244:7::/64 -m set --match-set KP-6-CLUSTER-IP dst,dst -j KP-IPVS-MARK-MASQ"},
		{"BridgeInterface", proxy.Config{DetectLocal: proxy.DetectLocal{Mode: proxy.LocalModeBridgeInterface, BridgeInterface: "cbr0"}},
			proxy.IPv4, "! -i cbr0 -m set --match-set KP-CLUSTER-IP dst,dst -j KP-IPVS-MARK-MASQ"},
		{"InterfaceNamePrefix", proxy.Config{DetectLocal: proxy.DetectLocal{Mode: proxy.LocalModeInterfaceNamePrefix, InterfaceNamePrefix: "veth"}},
			proxy.IPv4, "! -i veth+ -m set --match-set KP-CLUSTER-IP dst,dst -j KP-IPVS-MARK-MASQ"},
		{"NodeCIDR without a pod CIDR of the family: the node's own connections", proxy.Config{
			DetectLocal: proxy.DetectLocal{Mode: proxy.LocalModeNodeCIDR, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("fd00:10:244:7::/64")}}},
			proxy.IPv4, "-m set --match-set KP-CLUSTER-IP src,dst -j KP-IPVS-MARK-MASQ"},
	} {
		notLocal, _ := iptables.LocalMatch(c.cfg, c.family, true)
		in := string(restoreInput(renderChains(rulesInput{family: c.family, masqMark: 0x4000, notLocal: notLocal}), nil))
		if !strings.Contains(in, c.match+"\n") {
			t.Errorf("%s: restore input lacks %q:\n%s", c.name, c.match, in)
		}
	}
}
