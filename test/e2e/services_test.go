package e2e

// Service semantics with real packets, after upstream's [sig-network]
// Services e2e cases: session affinity, LoadBalancer and external IPs with
// source ranges, wrong ports, IPv6-only Services, NodePort addresses, and
// Services changing shape on a live node (traffic policies:
// traffic_policy_test.go).

import (
	"bufio"
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
//
// An empty listing proves nothing by itself (no conntrack in the node, a
// tool that fails or prints elsewhere), so first, in the same world and
// with the same listing, a connection the node does forward untouched —
// from the client to a pod's own address — must show its entry.
func (e *env) notForwarded(t *testing.T, ip netip.Addr) {
	t.Helper()
	pods := e.w.Pods()
	if len(pods) == 0 {
		t.Fatalf("notForwarded %s: the world has no pod for the positive control", ip)
	}
	control := pods[0].IP
	if ip.Is6() {
		control = pods[0].IP6
	}
	addr := netip.AddrPortFrom(control, uint16(e.w.TCPPorts()[0])).String()
	if _, err := e.w.Dial(e.w.Client(), "tcp", addr, 2*time.Second); err != nil {
		t.Fatalf("positive control: the client does not reach %s through the node: %v", addr, err)
	}
	if out := e.conntrackTo(t, control); !strings.Contains(out, "src="+control.String()+" ") {
		t.Fatalf("positive control: the node forwarded a connection to %s, but its conntrack listing holds no reply from it:\n%s", addr, out)
	}
	if out := e.conntrackTo(t, ip); strings.Contains(out, "src="+ip.String()+" ") {
		t.Errorf("the node let traffic to %s through without DNAT:\n%s", ip, out)
	}
}

// conntrackTo lists the node's conntrack entries whose original
// destination is ip, failing t when conntrack fails.
func (e *env) conntrackTo(t *testing.T, ip netip.Addr) string {
	t.Helper()
	fam := "ipv4"
	if ip.Is6() {
		fam = "ipv6"
	}
	out, err := e.w.Exec(e.w.Node(), "conntrack", "-L", "-f", fam, "-d", ip.String())
	if err != nil {
		t.Fatalf("list the node's conntrack entries to %s: %v", ip, err)
	}
	return out
}

// only checks that n requests are all answered, by pods in want only.
func (e *env) only(t *testing.T, ns, network, addr string, n int, want ...string) map[string]int {
	t.Helper()
	counts := e.spread(t, ns, network, addr, n)
	for name, k := range counts {
		if !contains(want, name) {
			t.Errorf("%s %s from %s: %d of %d answered by %q, want only %v", network, addr, ns, k, n, name, want)
		}
	}
	return counts
}

// sticks checks that n requests from ns are all answered, by one pod of
// want.
func (e *env) sticks(t *testing.T, ns, network, addr string, n int, want ...string) {
	t.Helper()
	if err := e.stuck(ns, network, addr, n, want...); err != nil {
		t.Error(err)
	}
}

// stuck reports nil when n requests from ns are all answered, by one pod
// of want.
func (e *env) stuck(ns, network, addr string, n int, want ...string) error {
	counts, err := e.answered(ns, network, addr, n)
	if err != nil {
		return err
	}
	for name := range counts {
		if len(counts) != 1 || !contains(want, name) {
			return fmt.Errorf("%s %s from %s with ClientIP affinity: answered by %v, want one of %v only", network, addr, ns, counts, want)
		}
	}
	return nil
}

func TestSessionAffinityClientIPKeepsEachClientOnOneEndpoint(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 4)
		pods := e.w.Pods()
		backends, client := pods[:3], pods[3]
		names := e.podNames(backends...)
		svc := web(backends...)
		svc.AffinitySeconds = 3600
		e.write("web.yaml", svc)
		e.startKP()
		e.answers(client.NS, "tcp", webTCP, names...)

		for _, c := range []struct{ network, addr string }{{"tcp", webTCP}, {"udp", webUDP}} {
			e.sticks(t, client.NS, c.network, c.addr, 30, names...)
		}
		// The other client (the node, masqueraded as itself) has its own.
		e.sticks(t, e.w.Node(), "tcp", webTCP, 20, names...)

		svc.AffinitySeconds = 0
		e.write("web.yaml", svc)
		e.eventually("affinity switched off spreads again", 15*time.Second, func() error {
			counts, err := e.answered(client.NS, "tcp", webTCP, 30)
			if err != nil {
				return err
			}
			if len(counts) < 2 {
				return fmt.Errorf("answers %v", counts)
			}
			return nil
		})

		svc.AffinitySeconds = 2
		e.write("web.yaml", svc)
		e.eventually("affinity switched on again sticks", 15*time.Second, func() error {
			return e.stuck(client.NS, "tcp", webTCP, 20, names...)
		})
		// Up to here every mode proved each request answered, by an
		// endpoint; what follows reads a kernel table not every mode has.
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
		e.answers(client.NS, "tcp", webTCP, names...)
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
		svc.Ports = append(svc.Ports, Port{Name: "s", Port: 9000, TargetPort: 9090})
		for _, p := range backends {
			streamServer(t, p)
		}
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

		// A connection from the client, established before it leaves the
		// ranges: upstream's iptables and nftables modes check source
		// ranges when a connection starts, so it stays; its ipvs mode
		// checks every packet in filter INPUT (KUBE-PROXY-FIREWALL without
		// --ctstate NEW), so it is cut. Each kp mode does as its upstream
		// mode does (the userspace mode as the kernel modes: the proxied
		// connection is kp's own).
		stream := lbIP + ":9000"
		est, err := netns.DialConn(context.Background(), e.w.Client(), "tcp", stream)
		if err != nil {
			t.Fatalf("connect to %s: %v", stream, err)
		}
		defer est.Close()
		r := bufio.NewReader(est)
		ping := func() error {
			_ = est.SetDeadline(time.Now().Add(slow(3 * time.Second)))
			if _, err := fmt.Fprintf(est, "ping\n"); err != nil {
				return err
			}
			_, err := r.ReadString('\n')
			return err
		}
		if err := ping(); err != nil {
			t.Fatalf("the connection to %s does not answer: %v", stream, err)
		}
		svc.SourceRanges = []string{"10.255.0.0/16", "10.255.1.0/24"}
		e.write("web.yaml", svc)
		e.eventually("the client left the source ranges", 15*time.Second, func() error {
			return e.dropped(e.w.Client(), "tcp", lb)
		})
		switch err := ping(); {
		case m.ipvs && err == nil:
			t.Errorf("the connection established before the client left the source ranges still answers; upstream's ipvs mode cuts it")
		case !m.ipvs && err != nil:
			t.Errorf("the connection established before the client left the source ranges: %v", err)
		}
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
		// nftables: a plain ClusterIP port has no chain of its own; its
		// elements carry the Service port's comment.
		extWords, dnsWords := []string{"ext-e2e/web"}, []string{"udp . 53", "e2e/web:dns"}
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
		// A change reaches the kernel in steps, each checked by the
		// traffic before the next line of the test: the source's Service
		// and EndpointSlice are separate updates (a sync may run between
		// them: a removed port without endpoints, refused, for a moment),
		// and the iptables modes commit nat, then filter. A late rule
		// goes at the next sync, within milliseconds; a stale one stays
		// (well past 5 s: the periodic sync comes every 30 s).
		//
		// present is lacks' positive control: each word is in the rules
		// before the change that should remove it, or its absence after
		// would prove nothing. It returns the words for that lacks.
		present := func(what string, words ...string) []string {
			t.Helper()
			e.eventually(what+": the ruleset holds "+strings.Join(words, ", "), 5*time.Second, func() error {
				out := e.rules()
				for _, w := range words {
					if !strings.Contains(out, w) {
						return fmt.Errorf("the ruleset does not hold %q:\n%s", w, out)
					}
				}
				return nil
			})
			return words
		}
		lacks := func(what string, words ...string) {
			t.Helper()
			e.eventually(what+": no rule of it stays", 5*time.Second, func() error {
				out := e.rules()
				for _, w := range words {
					if strings.Contains(out, w) {
						return fmt.Errorf("the ruleset still holds %q:\n%s", w, out)
					}
				}
				return nil
			})
		}

		svc.Type = v1.ServiceTypeNodePort
		svc.Ports[0].NodePort = 30080
		e.write("web.yaml", svc)
		e.answers(e.w.Client(), "tcp", nodeTCP, names...)

		// Source ranges (the client's own address): the iptables mode
		// writes a KP-FW- chain only for a LoadBalancer that has them.
		svc.Type = v1.ServiceTypeLoadBalancer
		svc.LoadBalancerIPs = []string{"10.96.200.2"}
		svc.SourceRanges = []string{e.w.ClientIP().String() + "/32"}
		e.write("web.yaml", svc)
		e.answers(e.w.Client(), "tcp", lb, names...)
		e.answers(e.w.Client(), "tcp", nodeTCP, names...)
		ext := present("a LoadBalancer", append([]string{"30080", "10.96.200.2"}, extWords...)...)

		svc.Type, svc.LoadBalancerIPs, svc.SourceRanges, svc.Ports[0].NodePort = v1.ServiceTypeClusterIP, nil, nil, 0
		e.write("web.yaml", svc)
		e.eventually("back to ClusterIP: the NodePort is gone", 15*time.Second, func() error {
			if _, err := e.w.Dial(e.w.Client(), "tcp", nodeTCP, time.Second); err == nil {
				return fmt.Errorf("NodePort still answers")
			}
			return nil
		})
		e.answers(e.w.Client(), "tcp", webTCP, names...)
		lacks("back to ClusterIP", ext...)

		// A port added, one removed: the removed one is refused (a port the
		// ClusterIP no longer has), and nothing of it stays.
		dns := present("with port dns", dnsWords...)
		// The iptables-style listings hold a UDP rule per ClusterIP port.
		udpRule := func() string { return ruleLine(e.rules(), "10.96.0.10/32", "-p udp") }
		if m.rulesInIPTables() && udpRule() == "" {
			t.Fatalf("with port dns: no UDP rule for the ClusterIP in:\n%s", e.rules())
		}
		svc.Ports = []Port{svc.Ports[0], {Name: "alt", Port: 81, TargetPort: 8081}}
		e.write("web.yaml", svc)
		e.answers(e.w.Client(), "tcp", "10.96.0.10:81", names...)
		e.eventually("the removed UDP port is refused", 15*time.Second, func() error {
			if _, err := e.w.Dial(e.w.Client(), "udp", webUDP, time.Second); !isRefused(err) {
				return fmt.Errorf("udp %s: %v, want refused", webUDP, err)
			}
			return nil
		})
		lacks("port dns removed", dns...)
		if line := udpRule(); m.rulesInIPTables() && line != "" {
			t.Errorf("port dns removed: a UDP rule for the ClusterIP stays: %s", line)
		}

		// Deleted, then recreated with the same name at another address.
		// (IPVS virtual servers and set entries carry no Service names.)
		webWords := []string{"e2e/web", "10.96.0.10"}
		if m.ipvs {
			webWords = []string{"10.96.0.10"}
		}
		web := present("before the delete", webWords...)
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
		lacks("deleted", web...)
		svc.ClusterIPs = []string{"10.96.0.12"}
		e.write("web.yaml", svc)
		e.answers(e.w.Client(), "tcp", "10.96.0.12:80", names...)
		present("recreated elsewhere", "10.96.0.12")
		lacks("recreated elsewhere", "10.96.0.10")
	})
}
