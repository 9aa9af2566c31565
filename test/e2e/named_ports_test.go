package e2e

import (
	"fmt"
	"strconv"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/test/netns"
)

// askEvery makes n requests from ns to addr and counts the answers per
// name. Unlike spread, any failed request fails t: a check that every
// answer came from the right servers must not pass on no answer at all.
func (e *env) askEvery(t *testing.T, ns, network, addr string, n int, want ...string) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for i := 0; i < n; i++ {
		name, err := e.ask(ns, network, addr)
		if err != nil {
			t.Fatalf("%s %s from %s: request %d of %d failed: %v (answers so far %v)", network, addr, ns, i+1, n, err, counts)
		}
		if !contains(want, name) {
			t.Errorf("%s %s from %s: answered by %q, want only %v", network, addr, ns, name, want)
		}
		counts[name]++
	}
	return counts
}

// TestNamedTargetPortsReachEachPodOnItsOwnNumber: a Service whose
// targetPorts are names, as a Deployment's pods name their container ports,
// and whose two pods number those ports differently. The EndpointSlices
// carry each Service port's name with each pod's number; every Service port
// must reach each pod on the number its own name has there. Each pod serves
// only those numbers, one server per number answering with pod:number, so
// a port taken by position or from another name is refused or answered by
// the wrong server.
func TestNamedTargetPortsReachEachPodOnItsOwnNumber(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		e := newEnv(t, m, 3)
		pods := e.w.Pods()
		backends, client := pods[:2], pods[2]
		echo, err := netns.Build("./test/echo")
		if err != nil {
			t.Fatalf("echo does not build: %v", err)
		}
		// Service port name → container port name, protocol, and each
		// pod's number for it.
		ports := []struct {
			name, target string
			proto        v1.Protocol
			port         int32
			numbers      [2]int32
		}{
			{"a", "web-a", v1.ProtocolTCP, 80, [2]int32{9101, 9201}},
			{"b", "web-b", v1.ProtocolTCP, 81, [2]int32{9102, 9202}},
			{"u", "dns-u", v1.ProtocolUDP, 53, [2]int32{9103, 9203}},
		}
		svc := Service{Name: "named", ClusterIPs: []string{"10.96.0.20"}}
		for _, p := range ports {
			svc.Ports = append(svc.Ports, Port{Name: p.name, Protocol: p.proto, Port: p.port, TargetPortName: p.target})
		}
		for i, pod := range backends {
			ep := Endpoint{IP: pod.IP.String(), NodeName: nodeName, Ports: map[string]int32{}}
			for _, p := range ports {
				ep.Ports[p.name] = p.numbers[i]
				flag, addr := "-listen", ":"+strconv.Itoa(int(p.numbers[i]))
				if p.proto == v1.ProtocolUDP {
					flag = "-udp"
				}
				netns.StartIn(t, pod.NS, echo, "-name", served(pod, p.numbers[i]), flag, addr)
			}
			svc.Endpoints = append(svc.Endpoints, ep)
		}
		e.write("named.yaml", svc)
		e.startKP()

		for _, p := range ports {
			network := "tcp"
			if p.proto == v1.ProtocolUDP {
				network = "udp"
			}
			addr := hostPort("10.96.0.20", int(p.port))
			want := []string{served(backends[0], p.numbers[0]), served(backends[1], p.numbers[1])}
			e.answers(client.NS, network, addr, want...)
			counts := e.askEvery(t, client.NS, network, addr, 40, want...)
			for _, w := range want {
				if counts[w] == 0 {
					t.Errorf("port %s (%s %s, targetPort %s): %s never answered in 40 requests: %v",
						p.name, network, addr, p.target, w, counts)
				}
			}
			t.Logf("port %s (%s %s → %s): %v", p.name, network, addr, p.target, counts)
		}
	})
}

// served is the name an extra echo server of pod answers with: the pod
// and the port number it listens on.
func served(pod *netns.Pod, port int32) string { return fmt.Sprintf("%s:%d", pod.Name, port) }
