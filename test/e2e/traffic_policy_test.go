package e2e

// Traffic policies with real packets, after upstream's [sig-network]
// Services e2e cases: externalTrafficPolicy (the client's address kept,
// local endpoints only), internalTrafficPolicy, terminating endpoints as a
// fallback, and topology hints.

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/test/netns"
)

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
		e.writeNodeInZone("zone-a")
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
			counts, err := e.answered(client.NS, "tcp", webTCP, 45)
			if err == nil && len(counts) != 3 {
				err = fmt.Errorf("answers %v", counts)
			}
			return err
		})

		// trafficDistribution PreferClose with no hints written: kp hints as
		// the EndpointSlice controller would, each endpoint for its own zone.
		svc.TrafficDistribution = v1.ServiceTrafficDistributionPreferClose
		for i := range svc.Endpoints {
			svc.Endpoints[i].ZoneHints = nil
		}
		e.write("web.yaml", svc)
		e.eventually("PreferClose keeps to zone-a", 15*time.Second, func() error {
			counts, err := e.answered(client.NS, "tcp", webTCP, 30)
			if err == nil && counts[pods[0].Name] != 30 {
				err = fmt.Errorf("answers %v", counts)
			}
			return err
		})
	})
}

// TestTopologyNodeHintsAndPreferSameNodeKeepTrafficOnTheNode: endpoints
// hinted forNodes (as the EndpointSlice controller hints them for
// trafficDistribution PreferSameNode) keep this node's traffic on the
// endpoint hinted for it; when that endpoint goes away, the rest are hinted
// for other nodes only, and kp falls back as upstream's CategorizeEndpoints
// documents: to the zone hints (this node's zone-a), and to every endpoint
// once no endpoint is hinted for the zone either. The same again with
// trafficDistribution PreferSameNode and no hints written, which kp hints
// itself as the controller would (docs/features.md, footnote ¹).
func TestTopologyNodeHintsAndPreferSameNodeKeepTrafficOnTheNode(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 4)
		pods := e.w.Pods()
		client := pods[3]
		e.writeNodeInZone("zone-a")
		placed := func(p *netns.Pod, on, zone string, hinted bool) Endpoint {
			ep := Endpoint{IP: p.IP.String(), NodeName: on, Zone: zone}
			if hinted {
				ep.NodeHints, ep.ZoneHints = []string{on}, []string{zone}
			}
			return ep
		}
		// pod-0 on this node, pod-1 on another node of zone-a, pod-2 on a
		// node of zone-b.
		all := func(hinted bool) []Endpoint {
			return []Endpoint{placed(pods[0], nodeName, "zone-a", hinted), placed(pods[1], otherNode, "zone-a", hinted),
				placed(pods[2], "node-b", "zone-b", hinted)}
		}
		steady := func(what string, want ...string) {
			t.Helper()
			// Until the change is in: 20 requests answered by want only,
			// each of want among them.
			e.eventually(what, 15*time.Second, func() error {
				seen := map[string]int{}
				for i := 0; i < 20; i++ {
					name, err := e.ask(e.w.Node(), "tcp", webTCP)
					if err != nil || !contains(want, name) {
						return fmt.Errorf("answered by %q (%v), want one of %v", name, err, want)
					}
					seen[name]++
				}
				if len(seen) != len(want) {
					return fmt.Errorf("answered by %v, want each of %v", seen, want)
				}
				return nil
			})
			for _, ns := range []string{e.w.Node(), client.NS} {
				counts := e.askEvery(t, ns, "tcp", webTCP, 40, want...)
				for _, w := range want {
					if counts[w] == 0 {
						t.Errorf("%s: from %s, %s never answered in 40 requests: %v", what, ns, w, counts)
					}
				}
			}
		}

		svc := web()
		svc.Endpoints = all(true)
		e.write("web.yaml", svc)
		e.startKP()
		steady("forNodes: only the endpoint hinted for this node", pods[0].Name)

		svc.Endpoints = svc.Endpoints[1:]
		e.write("web.yaml", svc)
		steady("forNodes: this node's endpoint gone, zone-a's", pods[1].Name)

		svc.Endpoints = []Endpoint{placed(pods[1], otherNode, "zone-b", true), placed(pods[2], "node-b", "zone-b", true)}
		e.write("web.yaml", svc)
		steady("forNodes: nothing hinted for this node or its zone, every endpoint", pods[1].Name, pods[2].Name)

		svc.TrafficDistribution = v1.ServiceTrafficDistributionPreferSameNode
		svc.Endpoints = all(false)
		e.write("web.yaml", svc)
		steady("PreferSameNode: only this node's endpoint", pods[0].Name)

		svc.Endpoints = svc.Endpoints[1:]
		e.write("web.yaml", svc)
		steady("PreferSameNode: this node's endpoint gone, zone-a's", pods[1].Name)
	})
}

// writeNodeInZone rewrites the node's own Node object with the topology zone label.
func (e *env) writeNodeInZone(zone string) {
	e.t.Helper()
	node := Node(nodeName, []string{e.w.NodeIP().String(), e.w.NodeIP6().String()},
		[]string{e.w.PodCIDR().String(), e.w.PodCIDR6().String()})
	node.Labels = map[string]string{v1.LabelTopologyZone: zone}
	e.write("node.yaml", node)
}
