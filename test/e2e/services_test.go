package e2e

// Service semantics with real packets, after upstream's [sig-network]
// Services e2e cases: session affinity, traffic policies and source IP,
// terminating endpoints, topology, LoadBalancer and external IPs with source
// ranges, wrong ports, IPv6-only Services, NodePort addresses, and Services
// changing shape on a live node.

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/test/netns"
)

// otherNode is a node name that is not kp's: endpoints there are remote.
const otherNode = "other-node"

// onNode returns eps moved to node.
func onNode(node string, eps []Endpoint) []Endpoint {
	out := append([]Endpoint(nil), eps...)
	for i := range out {
		out[i].NodeName = node
	}
	return out
}

// dropped reports nil when a request from ns to addr goes unanswered (the
// packet was dropped), and an error when it is answered or refused.
func (e *env) dropped(ns, network, addr string) error {
	reply, err := e.w.Dial(ns, network, addr, time.Second)
	switch {
	case err == nil:
		return fmt.Errorf("%s %s from %s answered %q, want no answer", network, addr, ns, reply)
	case !isTimeout(err):
		return fmt.Errorf("%s %s from %s: %v, want no answer (dropped)", network, addr, ns, err)
	}
	return nil
}

// notForwarded checks that the node let no packet to ip through without
// DNAT. A client times out on a Service address whether the node drops the
// packet or forwards it on untouched (nothing there answers), so the proof
// of a drop is in the node's conntrack table: a forwarded packet leaves an
// entry whose reply comes from ip itself; a dropped one is never confirmed.
func (e *env) notForwarded(t *testing.T, ip netip.Addr) {
	t.Helper()
	fam := "ipv4"
	if ip.Is6() {
		fam = "ipv6"
	}
	out, _ := e.w.Exec(e.w.Node(), "conntrack", "-L", "-f", fam, "-d", ip.String())
	if strings.Contains(out, "src="+ip.String()+" ") {
		t.Errorf("the node let traffic to %s through without DNAT:\n%s", ip, out)
	}
}

// only checks that n requests are all answered, by pods in want only.
func (e *env) only(t *testing.T, ns, network, addr string, n int, want ...string) map[string]int {
	t.Helper()
	counts := e.spread(ns, network, addr, n)
	for name, k := range counts {
		if !contains(want, name) {
			t.Errorf("%s %s from %s: %d of %d answered by %q, want only %v", network, addr, ns, k, n, name, want)
		}
	}
	return counts
}

func TestSessionAffinityClientIPKeepsEachClientOnOneEndpoint(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 4)
		pods := e.w.Pods()
		backends, client := pods[:3], pods[3]
		svc := web(backends...)
		svc.AffinitySeconds = 3600
		e.write("web.yaml", svc)
		e.startKP()
		e.answers(client.NS, "tcp", webTCP)

		for _, c := range []struct{ network, addr string }{{"tcp", webTCP}, {"udp", webUDP}} {
			if counts := e.spread(client.NS, c.network, c.addr, 30); len(counts) != 1 {
				t.Errorf("%s with ClientIP affinity: one client reached %v", c.network, counts)
			}
		}
		// The other client (the node, masqueraded as itself) has its own.
		if counts := e.spread(e.w.Node(), "tcp", webTCP, 20); len(counts) != 1 {
			t.Errorf("the node with ClientIP affinity reached %v", counts)
		}

		svc.AffinitySeconds = 0
		e.write("web.yaml", svc)
		e.eventually("affinity switched off spreads again", 15*time.Second, func() error {
			if counts := e.spread(client.NS, "tcp", webTCP, 30); len(counts) < 2 {
				return fmt.Errorf("answers %v", counts)
			}
			return nil
		})

		svc.AffinitySeconds = 2
		e.write("web.yaml", svc)
		e.eventually("affinity switched on again sticks", 15*time.Second, func() error {
			if counts := e.spread(client.NS, "tcp", webTCP, 20); len(counts) != 1 {
				return fmt.Errorf("answers %v", counts)
			}
			return nil
		})
		// The client is remembered in the kernel until its timeout passes
		// without traffic; then it may move.
		client4 := client.IP.String()
		if !m.claims(featureKernelAffinity) {
			return
		}
		if !e.affinityRemembers(client4, 2*time.Second) {
			t.Errorf("the client %s is remembered by no affinity entry (%s)", client4, m.name)
		}
		time.Sleep(3 * time.Second)
		if e.affinityRemembers(client4, 2*time.Second) {
			t.Errorf("the client %s is still remembered 3s after a 2s timeout (%s)", client4, m.name)
		}
		e.answers(client.NS, "tcp", webTCP, e.podNames(backends...)...)
	})
}

func TestExternalTrafficPolicyLocalKeepsTheClientIPAndUsesOnlyLocalEndpoints(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 4)
		pods := e.w.Pods()
		local, remote, inCluster := pods[:2], pods[2], pods[3]
		svc := web()
		svc.Endpoints = append(endpoints(local...), onNode(otherNode, endpoints(remote))...)
		svc.Type = v1.ServiceTypeNodePort
		svc.Ports[0].NodePort, svc.Ports[1].NodePort = 30080, 30053
		svc.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		svc.ExternalIPs = []string{"10.96.201.1"}
		e.write("web.yaml", svc)
		e.startKP()

		localNames := e.podNames(local...)
		nodeTCP := hostPort(e.w.NodeIP().String(), 30080)
		nodeUDP := hostPort(e.w.NodeIP().String(), 30053)
		e.answers(e.w.Client(), "tcp", nodeTCP, localNames...)
		for _, c := range []struct{ network, addr string }{{"tcp", nodeTCP}, {"udp", nodeUDP}, {"tcp", "10.96.201.1:80"}} {
			for i := 0; i < 30; i++ {
				reply, err := e.w.Dial(e.w.Client(), c.network, c.addr, 2*time.Second)
				name, seen := netns.ParseReply(reply)
				if err != nil || !contains(localNames, name) {
					t.Fatalf("%s %s from the client: %q, %v; want one of %v", c.network, c.addr, reply, err, localNames)
				}
				if ap, err := netip.ParseAddrPort(seen); m.claims(featureClientIP) && (err != nil || ap.Addr() != e.w.ClientIP()) {
					t.Fatalf("%s %s: %s saw the client as %s, want its own address %s", c.network, c.addr, name, seen, e.w.ClientIP())
				}
			}
		}

		// Pods and the node itself still reach every endpoint, as upstream.
		all := e.podNames(pods[:3]...)
		if !m.claims(featureLocalPolicyInternalReach) {
			skipUnclaimed(t, m, featureLocalPolicyInternalReach)
		}
		for _, from := range []string{inCluster.NS, e.w.Node()} {
			counts := e.only(t, from, "tcp", nodeTCP, 60, all...)
			if counts[remote.Name] == 0 {
				t.Errorf("NodePort from %s never reached the remote endpoint: %v", from, counts)
			}
		}

		// No local endpoint left: outside clients are dropped, not refused
		// (the Service has endpoints elsewhere); pods still get through.
		svc.Endpoints = onNode(otherNode, endpoints(pods[:3]...))
		e.write("web.yaml", svc)
		e.eventually("NodePort without local endpoints drops", 15*time.Second, func() error {
			return e.dropped(e.w.Client(), "tcp", nodeTCP)
		})
		if err := e.dropped(e.w.Client(), "tcp", "10.96.201.1:80"); err != nil {
			t.Errorf("external IP without local endpoints: %v", err)
		}
		e.only(t, inCluster.NS, "tcp", nodeTCP, 20, all...)
	})
}

func TestExternalTrafficPolicyClusterMasqueradesOutsideClients(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 2)
		svc := web(e.w.Pods()...)
		svc.Type = v1.ServiceTypeNodePort
		svc.Ports[0].NodePort = 30080
		e.write("web.yaml", svc)
		e.startKP()
		nodeTCP := hostPort(e.w.NodeIP().String(), 30080)
		e.answers(e.w.Client(), "tcp", nodeTCP)
		for i := 0; i < 10; i++ {
			reply, err := e.w.Dial(e.w.Client(), "tcp", nodeTCP, 2*time.Second)
			_, seen := netns.ParseReply(reply)
			if ap, perr := netip.ParseAddrPort(seen); err != nil || perr != nil || ap.Addr() == e.w.ClientIP() {
				t.Fatalf("NodePort with policy Cluster: %q, %v; the endpoint must see the node, not the client", reply, err)
			}
		}
	})
}

func TestInternalTrafficPolicyLocalUsesOnlyThisNodesEndpoints(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 3)
		pods := e.w.Pods()
		svc := web()
		svc.Endpoints = append(endpoints(pods[0]), onNode(otherNode, endpoints(pods[1]))...)
		svc.InternalTrafficPolicy = v1.ServiceInternalTrafficPolicyLocal
		e.write("web.yaml", svc)
		e.startKP()
		e.answers(pods[2].NS, "tcp", webTCP)
		e.only(t, pods[2].NS, "tcp", webTCP, 30, pods[0].Name)
		e.only(t, pods[2].NS, "udp", webUDP, 30, pods[0].Name)

		svc.Endpoints = onNode(otherNode, endpoints(pods[0], pods[1]))
		e.write("web.yaml", svc)
		e.eventually("no local endpoint: dropped", 15*time.Second, func() error {
			return e.dropped(pods[2].NS, "tcp", webTCP)
		})
		// Dropped, not accepted and held: the connect itself times out
		// (a client's connect timeout fires, as upstream's e2e test
		// expects).
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if c, err := netns.DialConn(ctx, pods[2].NS, "tcp", webTCP); err == nil {
			c.Close()
			t.Errorf("tcp %s: the connection was accepted, want the SYN dropped", webTCP)
		}
		e.notForwarded(t, netip.MustParseAddr("10.96.0.10"))
	})
}

func TestTerminatingEndpointsServeOnlyWhenNoneIsReady(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 4)
		pods := e.w.Pods()
		client := pods[3]
		gone := Endpoint{IP: pods[2].IP.String(), NodeName: nodeName, Ready: Bool(false), Serving: Bool(false), Terminating: Bool(true)}
		svc := web()
		svc.Endpoints = []Endpoint{
			{IP: pods[0].IP.String(), NodeName: nodeName},
			{IP: pods[1].IP.String(), NodeName: nodeName, Ready: Bool(false), Serving: Bool(true), Terminating: Bool(true)},
			gone,
		}
		e.write("web.yaml", svc)
		e.startKP()
		e.answers(client.NS, "tcp", webTCP)
		e.only(t, client.NS, "tcp", webTCP, 30, pods[0].Name)

		// The last ready pod goes: the serving, terminating one takes over,
		// never the one that stopped serving.
		svc.Endpoints[0] = NotReady(pods[0].IP.String())
		e.write("web.yaml", svc)
		e.answers(client.NS, "tcp", webTCP, pods[1].Name)
		e.only(t, client.NS, "tcp", webTCP, 30, pods[1].Name)
		e.only(t, client.NS, "udp", webUDP, 30, pods[1].Name)

		// Nothing serving: refused at once.
		svc.Endpoints[1] = gone
		svc.Endpoints[1].IP = pods[1].IP.String()
		e.write("web.yaml", svc)
		e.eventually("nothing serving: refused", 15*time.Second, func() error {
			_, err := e.w.Dial(client.NS, "tcp", webTCP, time.Second)
			if !isRefused(err) {
				return fmt.Errorf("got %v, want refused", err)
			}
			return nil
		})
	})
}

func TestTopologyHintsKeepTrafficInTheNodesZone(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 4)
		pods := e.w.Pods()
		client := pods[3]
		node := Node(nodeName, []string{e.w.NodeIP().String(), e.w.NodeIP6().String()},
			[]string{e.w.PodCIDR().String(), e.w.PodCIDR6().String()})
		node.Labels = map[string]string{v1.LabelTopologyZone: "zone-a"}
		e.write("node.yaml", node)
		zoned := func(p *netns.Pod, zone string, hints ...string) Endpoint {
			return Endpoint{IP: p.IP.String(), NodeName: otherNode, Zone: zone, ZoneHints: hints}
		}
		svc := web()
		svc.Endpoints = []Endpoint{zoned(pods[0], "zone-a", "zone-a"), zoned(pods[1], "zone-b", "zone-b"), zoned(pods[2], "zone-b", "zone-a")}
		e.write("web.yaml", svc)
		e.startKP()
		e.answers(client.NS, "tcp", webTCP)
		counts := e.only(t, client.NS, "tcp", webTCP, 60, pods[0].Name, pods[2].Name)
		if len(counts) != 2 {
			t.Errorf("hinted endpoints for zone-a not both used: %v", counts)
		}

		// Incomplete hints are ignored: every endpoint again.
		svc.Endpoints[1].ZoneHints = nil
		e.write("web.yaml", svc)
		e.eventually("incomplete hints: every endpoint", 15*time.Second, func() error {
			if counts := e.spread(client.NS, "tcp", webTCP, 45); len(counts) != 3 {
				return fmt.Errorf("answers %v", counts)
			}
			return nil
		})

		// trafficDistribution PreferClose with no hints written: kp hints as
		// the EndpointSlice controller would, each endpoint for its own zone.
		svc.TrafficDistribution = v1.ServiceTrafficDistributionPreferClose
		for i := range svc.Endpoints {
			svc.Endpoints[i].ZoneHints = nil
		}
		e.write("web.yaml", svc)
		e.eventually("PreferClose keeps to zone-a", 15*time.Second, func() error {
			if counts := e.spread(client.NS, "tcp", webTCP, 30); len(counts) != 1 || counts[pods[0].Name] != 30 {
				return fmt.Errorf("answers %v", counts)
			}
			return nil
		})
	})
}

func TestLoadBalancerAndExternalIPsWithSourceRanges(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 3)
		pods := e.w.Pods()
		backends, inCluster := pods[:2], pods[2]
		const lbIP, extIP = "10.96.200.1", "10.96.201.1"
		lb, ext := lbIP+":80", extIP+":80"
		svc := web(backends...)
		svc.Type = v1.ServiceTypeLoadBalancer
		svc.LoadBalancerIPs = []string{lbIP}
		svc.ExternalIPs = []string{extIP}
		svc.SourceRanges = []string{e.w.ClientIP().String() + "/32"}
		e.write("web.yaml", svc)
		e.startKP()

		names := e.podNames(backends...)
		e.answers(e.w.Client(), "tcp", lb, names...)
		e.only(t, e.w.Client(), "tcp", lb, 20, names...)
		e.only(t, e.w.Client(), "udp", lbIP+":53", 20, names...)
		e.only(t, e.w.Client(), "tcp", ext, 20, names...)
		// Source ranges guard the LoadBalancer IP only.
		if err := e.dropped(inCluster.NS, "tcp", lb); err != nil {
			t.Errorf("a source outside loadBalancerSourceRanges: %v", err)
		}
		e.only(t, inCluster.NS, "tcp", ext, 20, names...)

		svc.SourceRanges = []string{"10.255.0.0/16", "10.255.1.0/24"}
		e.write("web.yaml", svc)
		e.eventually("the client left the source ranges", 15*time.Second, func() error {
			return e.dropped(e.w.Client(), "tcp", lb)
		})
		svc.SourceRanges = nil
		e.write("web.yaml", svc)
		e.answers(inCluster.NS, "tcp", lb, names...)
		e.answers(e.w.Client(), "tcp", lb, names...)
	})
}

func TestClusterIPRejectsOtherPortsAndUnallocatedServiceAddressesAreDropped(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 2)
		e.write("web.yaml", web(e.w.Pods()...))
		e.startKP("--service-cidrs", netns.ServiceCIDR.String()+","+netns.ServiceCIDR6.String())
		e.answers(e.w.Client(), "tcp", webTCP)
		// An address of the service CIDRs that no Service has: dropped, so a
		// client times out as it would on a real network, and nothing is
		// routed on towards it.
		for _, addr := range []string{"10.96.0.77:80", "[fd00:96::77]:80"} {
			for _, network := range []string{"tcp", "udp"} {
				if err := e.dropped(e.w.Client(), network, addr); err != nil {
					t.Errorf("unallocated service address: %v", err)
				}
			}
			e.notForwarded(t, netip.MustParseAddrPort(addr).Addr())
		}
		for _, from := range []string{e.w.Client(), e.w.Pods()[0].NS} {
			for _, c := range []struct{ network, addr string }{{"tcp", "10.96.0.10:9999"}, {"udp", "10.96.0.10:9999"}, {"udp", "10.96.0.10:80"}} {
				start := time.Now()
				_, err := e.w.Dial(from, c.network, c.addr, 3*time.Second)
				if !isRefused(err) || time.Since(start) > 500*time.Millisecond {
					t.Errorf("%s %s from %s: %v after %v, want refused at once", c.network, c.addr, from, err, time.Since(start).Round(time.Millisecond))
				}
			}
		}
	})
}

func TestIPv6OnlyServiceAnswersOnItsClusterIPAndNodePort(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 3)
		pods := e.w.Pods()
		svc := Service{Name: "web6", Type: v1.ServiceTypeNodePort, ClusterIPs: []string{"fd00:96::20"},
			Ports: []Port{{Name: "http", Port: 80, TargetPort: 8080, NodePort: 30081},
				{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, TargetPort: 5353, NodePort: 30054}}}
		for _, p := range pods[:2] {
			svc.Endpoints = append(svc.Endpoints, Endpoint{IP: p.IP6.String(), NodeName: nodeName})
		}
		e.write("web6.yaml", svc)
		e.startKP()
		names := e.podNames(pods[:2]...)
		e.answers(pods[2].NS, "tcp", "[fd00:96::20]:80", names...)
		e.only(t, pods[2].NS, "tcp", "[fd00:96::20]:80", 20, names...)
		e.only(t, pods[2].NS, "udp", "[fd00:96::20]:53", 20, names...)
		nodePort6 := netip.AddrPortFrom(e.w.NodeIP6(), 30081).String()
		e.answers(e.w.Client(), "tcp", nodePort6, names...)
		e.only(t, e.w.Client(), "udp", netip.AddrPortFrom(e.w.NodeIP6(), 30054).String(), 20, names...)
	})
}

func TestNodePortAnswersOnlyOnTheNodePortAddresses(t *testing.T) {
	t.Parallel()
	nodePort := func(e *env) Service {
		svc := web(e.w.Pods()[:2]...)
		svc.Type = v1.ServiceTypeNodePort
		svc.Ports[0].NodePort = 30080
		return svc
	}
	t.Run("the mode's default addresses", func(t *testing.T) {
		forEachMode(t, func(t *testing.T, m mode) {
			e := newEnv(t, m, 3)
			e.write("web.yaml", nodePort(e))
			e.startKP()
			e.answers(e.w.Client(), "tcp", hostPort(e.w.NodeIP().String(), 30080))
			// The bridge address is the node's too, but not a primary IP:
			// nftables mode leaves it out, iptables mode answers on every
			// IP of the node, each as upstream's mode of that name.
			bridge := hostPort(e.w.GatewayIP().String(), 30080)
			if m.nodePortsOnEveryIP {
				e.answers(e.w.Pods()[2].NS, "tcp", bridge)
				return
			}
			if _, err := e.w.Dial(e.w.Pods()[2].NS, "tcp", bridge, 2*time.Second); err == nil {
				t.Errorf("NodePort answered on the bridge address %s, not a primary node IP", e.w.GatewayIP())
			}
		})
	})
	t.Run("the addresses in --nodeport-addresses", func(t *testing.T) {
		forEachMode(t, func(t *testing.T, m mode) {
			e := newEnv(t, m, 3)
			e.write("web.yaml", nodePort(e))
			e.startKP("--nodeport-addresses", e.w.PodCIDR().String())
			e.answers(e.w.Pods()[2].NS, "tcp", hostPort(e.w.GatewayIP().String(), 30080))
			_, err := e.w.Dial(e.w.Client(), "tcp", hostPort(e.w.NodeIP().String(), 30080), 2*time.Second)
			if err == nil {
				t.Errorf("NodePort answered on %s, outside --nodeport-addresses %s", e.w.NodeIP(), e.w.PodCIDR())
			}
		})
	})
}

func TestServiceChangesOnALiveNodeLeaveNoStaleRules(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 3)
		pods := e.w.Pods()
		names := e.podNames(pods...)
		nodeTCP := hostPort(e.w.NodeIP().String(), 30080)
		const lb = "10.96.200.2:80"
		svc := web(pods...)
		e.write("web.yaml", svc)
		e.startKP()
		e.answers(e.w.Client(), "tcp", webTCP, names...)

		// What a stale rule would hold, in each mode's words: nftables
		// names chains and comments after the Service and lists map keys
		// as "udp . 53"; iptables (upstream's layout) comments each rule
		// "namespace/name:port …" and keeps external traffic in KP-EXT-
		// chains.
		extWords, dnsWords := []string{"ext-e2e/web"}, []string{"udp . 53", "e2e/web/udp/dns"}
		if m.iptables() {
			extWords, dnsWords = []string{"KP-EXT-", "KP-FW-"}, []string{"e2e/web:dns"}
		}
		if m.ipvs {
			// Its virtual servers (ipvsadm -Ln) and set entries.
			extWords, dnsWords = []string{"10.96.200.2,tcp:80", ":30080 "}, []string{"10.96.0.10:53", "10.96.0.10,udp:53"}
		}
		if m.userspace {
			// Its redirect table: a rule per address and port, each
			// commented with the Service port; NodePorts match local
			// addresses by fib.
			extWords, dnsWords = []string{"fib daddr type local"}, []string{"e2e/web:dns"}
			if m.rulesInIPTables() {
				extWords = []string{"--dst-type LOCAL"}
			}
		}
		lacks := func(what string, words ...string) {
			t.Helper()
			out := e.rules()
			for _, w := range words {
				if strings.Contains(out, w) {
					t.Errorf("%s: the ruleset still holds %q:\n%s", what, w, out)
				}
			}
		}

		svc.Type = v1.ServiceTypeNodePort
		svc.Ports[0].NodePort = 30080
		e.write("web.yaml", svc)
		e.answers(e.w.Client(), "tcp", nodeTCP, names...)

		svc.Type = v1.ServiceTypeLoadBalancer
		svc.LoadBalancerIPs = []string{"10.96.200.2"}
		e.write("web.yaml", svc)
		e.answers(e.w.Client(), "tcp", lb, names...)
		e.answers(e.w.Client(), "tcp", nodeTCP, names...)

		svc.Type, svc.LoadBalancerIPs, svc.Ports[0].NodePort = v1.ServiceTypeClusterIP, nil, 0
		e.write("web.yaml", svc)
		e.eventually("back to ClusterIP: the NodePort is gone", 15*time.Second, func() error {
			if _, err := e.w.Dial(e.w.Client(), "tcp", nodeTCP, time.Second); err == nil {
				return fmt.Errorf("NodePort still answers")
			}
			return nil
		})
		e.answers(e.w.Client(), "tcp", webTCP, names...)
		lacks("back to ClusterIP", append([]string{"30080", "10.96.200.2"}, extWords...)...)

		// A port added, one removed: the removed one is refused (a port the
		// ClusterIP no longer has), and nothing of it stays.
		svc.Ports = []Port{svc.Ports[0], {Name: "alt", Port: 81, TargetPort: 8081}}
		e.write("web.yaml", svc)
		e.answers(e.w.Client(), "tcp", "10.96.0.10:81", names...)
		e.eventually("the removed UDP port is refused", 15*time.Second, func() error {
			if _, err := e.w.Dial(e.w.Client(), "udp", webUDP, time.Second); !isRefused(err) {
				return fmt.Errorf("udp %s: %v, want refused", webUDP, err)
			}
			return nil
		})
		lacks("port dns removed", dnsWords...)
		if line := ruleLine(e.rules(), "10.96.0.10/32", "-p udp"); line != "" {
			t.Errorf("port dns removed: a UDP rule for the ClusterIP stays: %s", line)
		}

		// Deleted, then recreated with the same name at another address.
		if err := e.dir.Remove("web.yaml"); err != nil {
			t.Fatal(err)
		}
		e.eventually("deleted: no longer answers", 15*time.Second, func() error {
			if _, err := e.w.Dial(e.w.Client(), "tcp", webTCP, time.Second); err == nil {
				return fmt.Errorf("still answers")
			}
			return nil
		})
		// The file's EndpointSlice and Service may go in two syncs: with the
		// first, the ClusterIP already refuses (no endpoints) while its
		// rules are there; the second must remove every one of them.
		e.eventually("deleted: its rules are gone", 15*time.Second, func() error {
			if out := e.rules(); strings.Contains(out, "e2e/web") || strings.Contains(out, "10.96.0.10") {
				return fmt.Errorf("the ruleset still holds e2e/web or 10.96.0.10")
			}
			return nil
		})
		lacks("deleted", "e2e/web", "10.96.0.10")
		svc.ClusterIPs = []string{"10.96.0.12"}
		e.write("web.yaml", svc)
		e.answers(e.w.Client(), "tcp", "10.96.0.12:80", names...)
		lacks("recreated elsewhere", "10.96.0.10")
	})
}
