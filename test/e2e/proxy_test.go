package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/test/netns"
)

// web is the Service most tests use: TCP 80 → 8080 and UDP 53 → 5353 on
// ClusterIP 10.96.0.10 (and fd00:96::10 when dual-stack).
func web(pods ...*netns.Pod) Service {
	return Service{
		Name:       "web",
		ClusterIPs: []string{"10.96.0.10"},
		Ports: []Port{
			{Name: "http", Port: 80, TargetPort: 8080},
			{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, TargetPort: 5353},
		},
		Endpoints: endpoints(pods...),
	}
}

const (
	webTCP = "10.96.0.10:80"
	webUDP = "10.96.0.10:53"
)

func TestClusterIPSpreadsEvenlyOverEveryEndpointAndOnlyThem(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 4)
		pods := e.w.Pods()
		backends, outsider := pods[:3], pods[3]
		e.write("web.yaml", web(backends...))
		e.startKP()
		e.answers(outsider.NS, "tcp", webTCP)

		names := e.podNames(backends...)
		for _, c := range []struct{ network, addr string }{{"tcp", webTCP}, {"udp", webUDP}} {
			t.Run(c.network, func(t *testing.T) {
				// From a pod that is not an endpoint: each request is a new
				// connection (a new source port), so a new random choice.
				const n = 300
				counts := e.spread(t, outsider.NS, c.network, c.addr, n)
				// A fair spread exceeds the p < 0.001 limit once in 1,000
				// draws, and a run of make test checks about twenty: one
				// over it is drawn again, and fails only if the second is
				// over it too (once in a million for a fair spread; a
				// real bias, an endpoint's share off by half, exceeds it
				// in nearly every draw of 300).
				limit := chiSquareCritical001[len(names)-1]
				if x2 := chiSquare(counts, names); x2 > limit {
					t.Logf("%s spread over %d requests: %v (chi-square %.2f > %.1f): drawn again", c.network, n, counts, x2, limit)
					counts = e.spread(t, outsider.NS, c.network, c.addr, n)
				}
				for name, k := range counts {
					if !contains(names, name) {
						t.Errorf("%d of %d requests answered by %q, not an endpoint of the Service", k, n, name)
					}
				}
				for _, name := range names {
					if counts[name] == 0 {
						t.Errorf("endpoint %s never chosen in %d requests: %v", name, n, counts)
					}
				}
				x2 := chiSquare(counts, names)
				if x2 > limit {
					t.Errorf("uneven spread %v: chi-square %.1f > %.1f (p < 0.001)", counts, x2, limit)
				}
				t.Logf("%s spread over %d requests: %v (chi-square %.2f)", c.network, n, counts, x2)
			})
		}

		t.Run("from every kind of client", func(t *testing.T) {
			for _, from := range []struct{ what, ns string }{
				{"the node itself", e.w.Node()},
				{"the off-node client", e.w.Client()},
				{"a pod that is an endpoint (hairpin)", backends[0].NS},
			} {
				for _, c := range []struct{ network, addr string }{{"tcp", webTCP}, {"udp", webUDP}} {
					counts := e.spread(t, from.ns, c.network, c.addr, 30)
					for name, k := range counts {
						if !contains(names, name) {
							t.Errorf("%s from %s: %d of 30 answered by %q", c.network, from.what, k, name)
						}
					}
				}
			}
			// A pod reaching itself through the Service needs the hairpin
			// masquerade; over 60 tries it picks itself with near certainty.
			counts := e.spread(t, backends[0].NS, "tcp", webTCP, 60)
			if counts[backends[0].Name] == 0 {
				t.Errorf("pod-0 never reached itself through the Service in 60 tries: %v", counts)
			}
		})
	})
}

func TestNodePortAnswersFromOffNodeClient(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 3)
		pods := e.w.Pods()
		svc := web(pods...)
		svc.Type = v1.ServiceTypeNodePort
		svc.Ports[0].NodePort = 30080
		svc.Ports[1].NodePort = 30053
		e.write("web.yaml", svc)
		e.startKP()

		names := e.podNames(pods...)
		nodeTCP := hostPort(e.w.NodeIP().String(), 30080)
		nodeUDP := hostPort(e.w.NodeIP().String(), 30053)
		e.answers(e.w.Client(), "tcp", nodeTCP, names...)
		for _, c := range []struct{ network, addr string }{{"tcp", nodeTCP}, {"udp", nodeUDP}} {
			counts := e.spread(t, e.w.Client(), c.network, c.addr, 60)
			for name, k := range counts {
				if !contains(names, name) {
					t.Errorf("NodePort %s %s: %d of 60 answered by %q", c.network, c.addr, k, name)
				}
			}
			if len(counts) < 2 {
				t.Errorf("NodePort %s %s: 60 requests all went to %v", c.network, c.addr, counts)
			}
		}
		// The same Service still answers on its ClusterIP.
		if name, err := e.ask(e.w.Client(), "tcp", webTCP); err != nil || !contains(names, name) {
			t.Errorf("ClusterIP of a NodePort Service: %q, %v", name, err)
		}
	})
}

func TestServiceWithoutEndpointsIsRefusedAtOnce(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 3)
		pods := e.w.Pods()
		ports := []Port{
			{Name: "http", Port: 80, TargetPort: 8080},
			{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, TargetPort: 5353},
		}
		e.write("services.yaml",
			web(pods...),
			Service{Name: "empty", ClusterIPs: []string{"10.96.0.20"}, Ports: ports},
			Service{Name: "not-ready", ClusterIPs: []string{"10.96.0.21"}, Ports: ports,
				Endpoints: []Endpoint{NotReady(pods[0].IP.String()), NotReady(pods[1].IP.String())}},
			Service{Name: "unpublished", ClusterIPs: []string{"10.96.0.22"}, Ports: ports, NoSlices: true},
		)
		e.startKP()
		e.answers(pods[0].NS, "tcp", webTCP) // synced

		for _, ip := range []string{"10.96.0.20", "10.96.0.21", "10.96.0.22"} {
			for _, from := range []string{pods[2].NS, e.w.Client(), e.w.Node()} {
				for _, c := range []struct {
					network string
					port    int
				}{{"tcp", 80}, {"udp", 53}} {
					addr := hostPort(ip, c.port)
					start := time.Now()
					reply, err := e.w.Dial(from, c.network, addr, 3*time.Second)
					took := time.Since(start)
					switch {
					case err == nil:
						t.Errorf("%s %s from %s: answered %q, want refused", c.network, addr, from, reply)
					case from == e.w.Node() && errors.Is(err, syscall.EPERM):
						// A reject in the output hook refuses a locally sent
						// datagram before it leaves: sendmsg fails with EPERM.
					case !isRefused(err):
						t.Errorf("%s %s from %s: %v after %v, want connection refused (TCP reset / ICMP unreachable)",
							c.network, addr, from, err, took.Round(time.Millisecond))
					case took > 500*time.Millisecond:
						t.Errorf("%s %s from %s: refused only after %v, want at once", c.network, addr, from, took)
					}
				}
			}
		}
	})
}

func TestRemovedEndpointIsNeverReachedByNewConnections(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 4)
		pods := e.w.Pods()
		client := pods[3]
		e.write("web.yaml", web(pods[:3]...))
		e.startKP()
		e.answers(client.NS, "tcp", webTCP)
		e.eventually("all three endpoints answer", 15*time.Second, func() error {
			counts, err := e.answered(client.NS, "tcp", webTCP, 30)
			if err == nil && len(counts) != 3 {
				err = fmt.Errorf("answers %v", counts)
			}
			return err
		})

		e.write("web.yaml", web(pods[0], pods[1]))
		removed := pods[2].Name
		// kp needs a moment to sync; from then on the removed endpoint must not
		// get a single new connection.
		e.eventually(removed+" no longer chosen", 15*time.Second, func() error {
			counts, err := e.answered(client.NS, "tcp", webTCP, 30)
			if err == nil && counts[removed] > 0 {
				err = fmt.Errorf("answers %v", counts)
			}
			return err
		})
		for _, c := range []struct{ network, addr string }{{"tcp", webTCP}, {"udp", webUDP}} {
			counts := e.spread(t, client.NS, c.network, c.addr, 150)
			if counts[removed] > 0 || counts[pods[0].Name] == 0 || counts[pods[1].Name] == 0 {
				t.Errorf("%s after removing %s: %v", c.network, removed, counts)
			}
		}
	})
}

func TestDeletedServiceNoLongerAnswers(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 3)
		pods := e.w.Pods()
		other := Service{Name: "other", ClusterIPs: []string{"10.96.0.30"},
			Ports: []Port{{Name: "http", Port: 80, TargetPort: 8081}}, Endpoints: endpoints(pods...)}
		e.write("web.yaml", web(pods...))
		e.write("other.yaml", other)
		e.startKP()
		e.answers(e.w.Client(), "tcp", webTCP)
		e.answers(e.w.Client(), "tcp", "10.96.0.30:80")

		if err := e.dir.Remove("web.yaml"); err != nil {
			t.Fatal(err)
		}
		quick := func(network, addr string) error {
			reply, err := e.w.Dial(e.w.Client(), network, addr, 300*time.Millisecond)
			if err == nil {
				return fmt.Errorf("%s %s still answers: %q", network, addr, reply)
			}
			return nil
		}
		e.eventually("deleted Service stops answering", 15*time.Second, func() error { return quick("tcp", webTCP) })
		for i := 0; i < 5; i++ {
			for _, c := range []struct{ network, addr string }{{"tcp", webTCP}, {"udp", webUDP}} {
				if err := quick(c.network, c.addr); err != nil {
					t.Error(err)
				}
			}
		}
		if _, err := e.ask(e.w.Client(), "tcp", "10.96.0.30:80"); err != nil {
			t.Errorf("the other Service stopped answering: %v", err)
		}
	})
}

func TestEditedManifestTakesEffectWithoutRestart(t *testing.T) {
	e := newEnv(t, modeNFTables, 3)
	pods := e.w.Pods()
	e.write("web.yaml", web(pods...))
	e.startKP()
	e.answers(e.w.Client(), "tcp", webTCP)
	pid := e.kp.Pid()

	// Edit the file in place: a new port, and only pod-0 left behind it.
	svc := web(pods[0])
	svc.Ports = append(svc.Ports, Port{Name: "alt", Port: 81, TargetPort: 8081})
	e.write("web.yaml", svc)
	e.answers(e.w.Client(), "tcp", "10.96.0.10:81", pods[0].Name)
	e.eventually("only pod-0 behind port 80", 15*time.Second, func() error {
		counts, err := e.answered(e.w.Client(), "tcp", webTCP, 20)
		if err == nil && counts[pods[0].Name] != 20 {
			err = fmt.Errorf("answers %v", counts)
		}
		return err
	})

	// A new file is picked up too.
	e.write("api.yaml", Service{Name: "api", ClusterIPs: []string{"10.96.0.40"},
		Ports: []Port{{Name: "http", Port: 80, TargetPort: 8080}}, Endpoints: endpoints(pods[1])})
	e.answers(e.w.Client(), "tcp", "10.96.0.40:80", pods[1].Name)

	if e.kp.Pid() != pid || !e.kp.Running() {
		t.Errorf("kp restarted (pid %d, was %d) or exited (%v)", e.kp.Pid(), pid, e.kp.ExitErr())
	}
}

func TestBrokenManifestLeavesOtherServicesWorking(t *testing.T) {
	e := newEnv(t, modeNFTables, 3)
	pods := e.w.Pods()
	e.write("web.yaml", web(pods...))
	// Broken from the start: a port that is not a number.
	if err := e.dir.WriteRaw("broken.yaml", []byte(strings.Join([]string{
		"apiVersion: v1",
		"kind: Service",
		"metadata: {name: broken, namespace: e2e}",
		"spec:",
		"  clusterIP: 10.96.0.50",
		"  ports: [{name: http, port: eighty, targetPort: 8080}]",
	}, "\n"))); err != nil {
		t.Fatal(err)
	}
	e.startKP()
	e.answers(e.w.Client(), "tcp", webTCP)

	// A good file added next to the broken one is loaded.
	api := Service{Name: "api", ClusterIPs: []string{"10.96.0.40"},
		Ports: []Port{{Name: "http", Port: 80, TargetPort: 8080}}, Endpoints: endpoints(pods[1])}
	e.write("api.yaml", api)
	e.answers(e.w.Client(), "tcp", "10.96.0.40:80", pods[1].Name)

	// A good file that breaks keeps its previous content in force.
	if err := e.dir.WriteRaw("api.yaml", []byte("apiVersion: v1\nkind: Service\nmetadata: {name: api\n")); err != nil {
		t.Fatal(err)
	}
	e.eventually("kp reports api.yaml", 15*time.Second, func() error {
		if !strings.Contains(e.kp.Log(), "api.yaml") {
			return fmt.Errorf("kp's log does not name api.yaml")
		}
		return nil
	})
	for i := 0; i < 20; i++ {
		if name, err := e.ask(e.w.Client(), "tcp", "10.96.0.40:80"); err != nil || name != pods[1].Name {
			t.Fatalf("api after its file broke: %q, %v; want its last good content in force", name, err)
		}
		if _, err := e.ask(e.w.Client(), "tcp", webTCP); err != nil {
			t.Fatalf("web after api.yaml broke: %v", err)
		}
	}
	if !strings.Contains(e.kp.Log(), "broken.yaml") {
		t.Errorf("kp's log does not name broken.yaml")
	}
	if !e.kp.Running() {
		t.Errorf("kp exited: %v", e.kp.ExitErr())
	}
}

func TestDualStackClusterIPAnswersOverIPv6(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 4)
		pods := e.w.Pods()
		svc := web(pods[:3]...)
		svc.ClusterIPs = []string{"10.96.0.10", "fd00:96::10"}
		e.write("web.yaml", svc)
		e.startKP()

		names := e.podNames(pods[:3]...)
		for _, c := range []struct{ network, addr string }{{"tcp", "[fd00:96::10]:80"}, {"udp", "[fd00:96::10]:53"}} {
			e.answers(pods[3].NS, c.network, c.addr, names...)
			counts := e.spread(t, pods[3].NS, c.network, c.addr, 60)
			for name, k := range counts {
				if !contains(names, name) {
					t.Errorf("%s %s: %d of 60 answered by %q", c.network, c.addr, k, name)
				}
			}
		}
		e.answers(e.w.Client(), "tcp", "[fd00:96::10]:80", names...)
		e.answers(pods[3].NS, "tcp", webTCP, names...)
	})
}

// Not parallel: its timing should not compete with the other tests.
func TestRestartLosesNoConnections(t *testing.T) {
	forEachModeSerial(t, func(t *testing.T, m mode) {
		skipUnclaimed(t, m, featureRestart)
		e := newEnvSerial(t, m, 4)
		pods := e.w.Pods()
		backends, client := pods[:3], pods[3]
		svc := web(backends...)
		svc.Type = v1.ServiceTypeNodePort
		svc.Ports[0].NodePort = 30080
		e.write("web.yaml", svc)
		// Three endpoints: a connection that lost its NAT and were
		// balanced afresh would most likely reach another one.
		for _, p := range backends {
			streamServer(t, p)
		}
		e.write("stream.yaml", Service{Name: "stream", ClusterIPs: []string{"10.96.0.12"},
			Ports: []Port{{Name: "s", Port: 9000, TargetPort: 9090}}, Endpoints: endpoints(backends...)})
		e.startKP()
		names := e.podNames(backends...)
		nodePort := hostPort(e.w.NodeIP().String(), 30080)
		e.answers(client.NS, "tcp", webTCP)
		e.answers(e.w.Client(), "tcp", nodePort)

		// Open before the restart and still echoing after it, from the
		// same endpoint.
		long := startStream(t, client.NS, streamTCP, slow(3*time.Second))
		// New connections from a pod to the ClusterIP and from the off-node
		// client to the NodePort, before, during and after the restart:
		// each one answered by a backend within netns.SlowConnect, so a
		// moment without rules (a lost SYN, sent again after 1 s) fails.
		loop := func(ns, addr string) *netns.Loop {
			return netns.StartLoop(netns.LoopSpec{
				Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
					return netns.DialConn(ctx, ns, network, addr)
				},
				Addrs:   []string{addr},
				Timeout: slow(5 * time.Second),
				// In the VM, whose emulated CPUs stall under load, the latency
				// bound is looser; a lost SYN still fails there by the kernel's
				// own retransmission count (Attempt.SYNRetransmits).
				Slow:  slow(netns.SlowConnect),
				Pause: 50 * time.Millisecond,
				Check: func(reply string) error {
					if name, _ := netns.ParseReply(reply); !contains(names, name) {
						return fmt.Errorf("answered %q, want one of %v", reply, names)
					}
					return nil
				},
			})
		}
		loops := []struct {
			name string
			l    *netns.Loop
		}{
			{"pod " + client.Name + " to ClusterIP " + webTCP, loop(client.NS, webTCP)},
			{"the off-node client to NodePort " + nodePort, loop(e.w.Client(), nodePort)},
		}
		time.Sleep(3 * time.Second)
		restart := time.Now()
		err := e.kp.Restart()
		e.waitHealthy()
		restarted := time.Now()
		t.Logf("kp restarted and healthy in %v", restarted.Sub(restart).Round(time.Millisecond))
		time.Sleep(3 * time.Second)
		for _, l := range loops {
			s := l.l.Stop()
			during := s.Since(restart)
			t.Logf("%s: %s; from the restart on: %s", l.name, s, during)
			if err := s.Err(); err != nil {
				t.Errorf("%s, across a kp restart: %v", l.name, err)
			}
			if n := len(during.Attempts); n < 20 {
				t.Errorf("%s: only %d new connections from the restart on: the loop did not run", l.name, n)
			}
		}
		from, pongs, longErr := long.stop()
		after := 0
		for _, p := range pongs {
			if p.After(restarted) {
				after++
			}
		}
		t.Logf("long-lived connection to %s: %d exchanges with %s, %d after the restart", streamTCP, len(pongs), from, after)
		if longErr != nil {
			t.Errorf("the long-lived connection to %s (endpoint %s) broke across a kp restart: %v", streamTCP, from, longErr)
		} else if after < 10 {
			t.Errorf("the long-lived connection to %s made only %d exchanges after the restart", streamTCP, after)
		}
		if err != nil {
			t.Fatalf("restart kp: %v", err)
		}
		e.answers(client.NS, "tcp", webTCP)
	})
}
