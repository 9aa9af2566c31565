package e2e

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/test/netns"
)

// The userspace mode's listeners bind every address on ports the kernel
// picks. Only the traffic kp redirected to them may reach them: a client
// that connects straight to a listener's port on one of the node's own
// addresses would reach a ClusterIP-only Service from outside the cluster,
// and a LoadBalancer's source ranges would not apply. Every listener of
// kp's process (ss in the node) is tried directly, on every address of the
// node, over both families, from the off-node client, from a pod and from
// the node itself (kp refuses them all: nothing but its redirects has a
// reason to use the ports); the Services still answer through their
// ClusterIPs and NodePorts, in both families.
func TestUserspaceListenersAreReachableOnlyThroughKPsRedirects(t *testing.T) {
	t.Parallel()
	for _, m := range []mode{modeUserspace, modeUserspaceIPTables} {
		t.Run(m.name, func(t *testing.T) {
			e := newEnv(t, m, 2)
			pods := e.w.Pods()
			web := web(pods...)
			web.ClusterIPs = []string{"10.96.0.10", "fd00:96::10"}
			np := web
			np.Name, np.Type, np.ClusterIPs = "np", v1.ServiceTypeNodePort, []string{"10.96.0.11", "fd00:96::11"}
			np.Ports = []Port{{Name: "http", Port: 80, TargetPort: 8080, NodePort: 30080},
				{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, TargetPort: 5353, NodePort: 30053}}
			e.write("web.yaml", web)
			e.write("np.yaml", np)
			e.startKP()

			client := e.w.Client()
			node4, node6 := e.w.NodeIP().String(), e.w.NodeIP6().String()
			through := []struct{ network, addr string }{
				{"tcp", "10.96.0.10:80"}, {"udp", "10.96.0.10:53"}, {"tcp", "[fd00:96::10]:80"}, {"udp", "[fd00:96::10]:53"},
				{"tcp", hostPort(node4, 30080)}, {"udp", hostPort(node4, 30053)},
				{"tcp", hostPort(node6, 30080)}, {"udp", hostPort(node6, 30053)},
			}
			for _, c := range through {
				e.answers(client, c.network, c.addr, e.podNames(pods...)...)
			}

			listeners := e.userspaceListeners()
			// Two Services of a TCP and a UDP port each: web's have their
			// ClusterIP listener, np's one for external traffic as well.
			if len(listeners) < 6 {
				t.Fatalf("kp holds %d listeners, want at least 6: %v\n%s", len(listeners), listeners, e.rules())
			}
			for _, port := range e.redirectPorts() {
				if !slices.ContainsFunc(listeners, func(l listener) bool { return l.port == port }) {
					t.Errorf("the redirects send traffic to port %d, where kp holds no listener %v", port, listeners)
				}
			}
			addrs := []netip.Addr{e.w.NodeIP(), e.w.NodeIP6(), e.w.GatewayIP(), e.w.GatewayIP6()}
			for _, from := range []struct{ what, ns string }{
				{"the off-node client", client}, {"a pod", pods[0].NS}, {"the node itself", e.w.Node()},
			} {
				var reached []string
				refused := map[string]int{}
				for _, l := range listeners {
					for _, a := range addrs {
						addr := netip.AddrPortFrom(a, uint16(l.port)).String()
						reply, err := netns.Dial(from.ns, l.network, addr, time.Second)
						if err == nil {
							reached = append(reached, fmt.Sprintf("%s %s (answered %q)", l.network, addr, reply))
							continue
						}
						refused[l.network+": "+failure(err)]++
					}
				}
				if len(reached) > 0 {
					t.Errorf("%s reached kp's listeners directly, not through a redirect, %d of %d times: %s",
						from.what, len(reached), len(listeners)*len(addrs), strings.Join(reached, "; "))
				}
				if len(refused) > 0 {
					t.Logf("%s, straight to kp's listeners: %s", from.what, strings.Join(counted(refused), ", "))
				}
			}
			// Still served through the redirects, after the direct tries.
			for _, c := range through {
				e.answers(client, c.network, c.addr, e.podNames(pods...)...)
			}
		})
	}
}

// listener is one of kp's listening sockets: its protocol and port.
type listener struct {
	network string
	port    int
}

// ssSocket is one line of ss -H -l -n -t -u -p: protocol, state, queues,
// local address:port, peer, process.
var ssSocket = regexp.MustCompile(`^(tcp|udp)\s+\S+\s+\d+\s+\d+\s+(\S+):(\d+)\s+\S+\s+users:.*pid=(\d+),`)

// userspaceListeners lists the TCP and UDP sockets kp's process holds open
// for anyone on every address (the userspace mode's listeners; its health
// and metrics servers listen on loopback here).
func (e *env) userspaceListeners() []listener {
	e.t.Helper()
	out, err := e.w.Exec(e.w.Node(), "ss", "-H", "-l", "-n", "-t", "-u", "-p")
	if err != nil {
		e.t.Fatalf("ss in the node: %v\n%s", err, out)
	}
	pid := strconv.Itoa(e.kp.Pid())
	var ls []listener
	for _, line := range strings.Split(out, "\n") {
		m := ssSocket.FindStringSubmatch(line)
		if m == nil || m[4] != pid || !slices.Contains([]string{"*", "0.0.0.0", "[::]"}, m[2]) {
			continue
		}
		port, _ := strconv.Atoi(m[3])
		if l := (listener{m[1], port}); !slices.Contains(ls, l) {
			ls = append(ls, l)
		}
	}
	return ls
}

// redirectPorts are the ports kp's redirects send traffic to: the nftables
// maps' values ("… : 41234") or iptables' REDIRECT --to-ports.
func (e *env) redirectPorts() []int {
	e.t.Helper()
	re := regexp.MustCompile(`(?:redirect to :|--to-ports |" : )(\d+)`)
	var ports []int
	for _, m := range re.FindAllStringSubmatch(e.rules(), -1) {
		p, _ := strconv.Atoi(m[1])
		if !slices.Contains(ports, p) {
			ports = append(ports, p)
		}
	}
	if len(ports) == 0 {
		e.t.Fatalf("no redirect port in kp's rules:\n%s", e.rules())
	}
	return ports
}
