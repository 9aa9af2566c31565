package migrate

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

func spName(name, port string, proto v1.Protocol) proxy.ServicePortName {
	return proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "demo", Name: name}, Port: port, Protocol: proto}
}

func eps(node string, ss ...string) []proxy.Endpoint {
	var out []proxy.Endpoint
	for _, s := range ss {
		out = append(out, proxy.Endpoint{IP: netip.MustParseAddr(s), Port: 8080, Ready: true, Serving: true}.At(node, ""))
	}
	return out
}

// verifyState is a node (10.0.0.5, fd00::5) with a Service of every kind
// of address, and Services that are not probed, with why.
func verifyState() *proxy.State {
	web, dns := spName("web", "http", v1.ProtocolTCP), spName("dns", "dns", v1.ProtocolUDP)
	fenced, local := spName("fenced", "http", v1.ProtocolTCP), spName("local", "http", v1.ProtocolTCP)
	sctp := spName("sctp", "s", v1.ProtocolSCTP)
	return &proxy.State{
		Node: proxy.Node{Name: "n1", IPs: addrs("10.0.0.5", "fd00::5")},
		Services: map[proxy.ServicePortName]*proxy.ServicePort{
			web: {Name: web, Type: v1.ServiceTypeLoadBalancer, Protocol: v1.ProtocolTCP, Port: 80, NodePort: 30080,
				ClusterIPs: addrs("10.96.0.10", "fd00:96::10"), ExternalIPs: addrs("192.0.2.10"), LoadBalancerIPs: addrs("203.0.113.7")},
			dns: {Name: dns, Type: v1.ServiceTypeNodePort, Protocol: v1.ProtocolUDP, Port: 53, NodePort: 30053,
				ClusterIPs: addrs("10.96.0.53")},
			fenced: {Name: fenced, Type: v1.ServiceTypeLoadBalancer, Protocol: v1.ProtocolTCP, Port: 80, NodePort: 30081,
				ClusterIPs: addrs("10.96.0.11"), LoadBalancerIPs: addrs("203.0.113.8"),
				LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}},
			local: {Name: local, Type: v1.ServiceTypeNodePort, Protocol: v1.ProtocolTCP, Port: 80, NodePort: 30082,
				ClusterIPs: addrs("10.96.0.12"), ExternalPolicyLocal: true},
			sctp: {Name: sctp, Protocol: v1.ProtocolSCTP, Port: 9, ClusterIPs: addrs("10.96.0.13")},
		},
		Endpoints: map[proxy.ServicePortName][]proxy.Endpoint{
			web:    eps("n1", "10.244.1.2", "fd00:244::2"),
			dns:    eps("n1", "10.244.1.3"),
			fenced: eps("n1", "10.244.1.4"),
			local:  eps("n2", "10.244.2.5"), // on another node: none local
		},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")},
	}
}

// The probe list holds every kind of address the node serves, TCP and
// UDP: the first ClusterIP per family, the NodePort on each NodePort
// address, each externalIP and LoadBalancer IP; the NodePort addresses are
// the node's own, reachable from off the node (no loopback, link-local, or
// Service address such as the ipvs mode's dummy interface holds).
func TestProbesCoverEveryAddressKindOnEachNodePortAddress(t *testing.T) {
	node := nodeAddrs{local: addrs("127.0.0.1", "10.0.0.5", "10.244.1.1", "10.96.0.10", "::1", "fe80::1", "fd00::5")}
	got, skipped := probesOf(verifyState(), node)
	var lines []string
	for _, r := range rounds(got) {
		var round []string
		for _, p := range r {
			round = append(round, p.String())
		}
		lines = append(lines, strings.Join(round, " | "))
	}
	want := []string{
		"demo/dns:dns UDP ClusterIP 10.96.0.53:53 | demo/fenced:http TCP ClusterIP 10.96.0.11:80 | " +
			"demo/local:http TCP ClusterIP 10.96.0.12:80 | " +
			"demo/web:http TCP ClusterIP 10.96.0.10:80 | demo/web:http TCP ClusterIP [fd00:96::10]:80",
		"demo/dns:dns UDP NodePort 10.0.0.5:30053 | demo/fenced:http TCP NodePort 10.0.0.5:30081 | " +
			"demo/web:http TCP NodePort 10.0.0.5:30080 | demo/web:http TCP NodePort [fd00::5]:30080",
		"demo/dns:dns UDP NodePort 10.244.1.1:30053 | demo/fenced:http TCP NodePort 10.244.1.1:30081 | " +
			"demo/web:http TCP NodePort 10.244.1.1:30080",
		"demo/web:http TCP externalIP 192.0.2.10:80",
		"demo/web:http TCP LoadBalancer IP 203.0.113.7:80",
	}
	if !slices.Equal(lines, want) {
		t.Errorf("rounds:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	wantSkipped := []string{
		"demo/fenced:http IPv4 LoadBalancer IP: loadBalancerSourceRanges, not probed from the node",
		"demo/local:http IPv4 NodePort: no endpoint usable from this node",
		"demo/sctp:s: SCTP is not probed",
	}
	if !slices.Equal(skipped, wantSkipped) {
		t.Errorf("skipped:\n%s\nwant:\n%s", strings.Join(skipped, "\n"), strings.Join(wantSkipped, "\n"))
	}
}

// The NodePort addresses follow the mode's --nodeport-addresses as a kp
// started in it reads them.
func TestNodePortAddrsFollowTheModesSettings(t *testing.T) {
	local := addrs("127.0.0.1", "10.0.0.5", "10.244.1.1", "10.96.0.10", "::1", "fe80::1", "fd00::5")
	st := verifyState()
	noNode := verifyState()
	noNode.Node.IPs = nil
	for _, tc := range []struct {
		name  string
		st    *proxy.State
		scope NodePortScope
		want  string
	}{
		{"every local address", st, NodePortScope{}, "[10.0.0.5 10.244.1.1 fd00::5]"},
		{"primary: the Node's IPs", st, NodePortScope{Primary: true}, "[10.0.0.5 fd00::5]"},
		{"primary without Node IPs: the default route's addresses", noNode, NodePortScope{Primary: true}, "[10.244.1.1]"},
		{"CIDRs", st, NodePortScope{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("127.0.0.0/8")}},
			"[10.244.1.1]"},
		{"a Node IP that is not local is not the node's", func() *proxy.State { s := verifyState(); s.Node.IPs = addrs("10.9.9.9"); return s }(),
			NodePortScope{Primary: true}, "[]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := nodePortAddrs(tc.st, nodeAddrs{local: local, defaultRoute: addrs("10.244.1.1"), scope: tc.scope})
			if s := fmt.Sprint(got); s != tc.want {
				t.Errorf("got %s, want %s", s, tc.want)
			}
		})
	}
}

// fakeNode is a node's forwarding: the backends whose rules are in the
// kernel, newest first (the kernel runs the newest of equal-priority
// chains first); a probe moves the counter of the first backend with a
// rule for its address.
type fakeNode struct {
	mu       sync.Mutex
	backends []*countingBackend
}

// countingBackend programs a rule per address of every service port,
// NodePorts on the node's address unless skipNodePorts (the bug: a mode
// that programs ClusterIPs but not NodePorts), and counts per endpoint.
type countingBackend struct {
	mode          proxy.Mode
	node          *fakeNode
	skipNodePorts bool
	rules         map[string]proxy.EndpointRef // "tcp 10.0.0.5:30080"
	counts        map[proxy.EndpointRef]proxy.EndpointCounter
}

func (b *countingBackend) Mode() proxy.Mode            { return b.mode }
func (b *countingBackend) Probe(context.Context) error { return nil }
func (b *countingBackend) Sync(_ context.Context, st *proxy.State) error {
	b.node.mu.Lock()
	defer b.node.mu.Unlock()
	b.rules = map[string]proxy.EndpointRef{}
	for name, sp := range st.Services {
		// The first endpoint of the address's family takes it.
		add := func(a netip.Addr, port int32) {
			for _, e := range st.Endpoints[name] {
				if e.IP.Is4() == a.Is4() {
					b.rules[strings.ToLower(string(sp.Protocol))+" "+netip.AddrPortFrom(a, uint16(port)).String()] =
						proxy.EndpointRef{ServicePort: name, Endpoint: e.AddrPort()}
					return
				}
			}
		}
		for _, a := range slices.Concat(sp.ClusterIPs, sp.ExternalIPs, sp.LoadBalancerIPs) {
			add(a, sp.Port)
		}
		if sp.NodePort != 0 && !b.skipNodePorts {
			add(netip.MustParseAddr("10.0.0.5"), sp.NodePort)
		}
	}
	if !slices.Contains(b.node.backends, b) {
		b.node.backends = append([]*countingBackend{b}, b.node.backends...)
	}
	return nil
}

func (b *countingBackend) Cleanup(context.Context) error {
	b.node.mu.Lock()
	defer b.node.mu.Unlock()
	b.node.backends = slices.DeleteFunc(b.node.backends, func(x *countingBackend) bool { return x == b })
	return nil
}

func (b *countingBackend) EndpointCounters(*proxy.State) (map[proxy.EndpointRef]proxy.EndpointCounter, error) {
	b.node.mu.Lock()
	defer b.node.mu.Unlock()
	out := map[proxy.EndpointRef]proxy.EndpointCounter{}
	for k, v := range b.counts {
		out[k] = v
	}
	return out, nil
}

// dial is VerifyOptions.Dial on the fake node.
func (n *fakeNode) dial(_ context.Context, network, addr string) (net.Conn, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, b := range n.backends {
		if ref, ok := b.rules[network+" "+addr]; ok {
			if b.counts == nil {
				b.counts = map[proxy.EndpointRef]proxy.EndpointCounter{}
			}
			c := b.counts[ref]
			c.Packets++
			b.counts[ref] = c
			return silentConn{}, nil
		}
	}
	return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
}

// silentConn accepts what is written and never answers (a UDP service
// need not).
type silentConn struct{ net.Conn }

func (silentConn) Write(b []byte) (int, error)     { return len(b), nil }
func (silentConn) Read([]byte) (int, error)        { return 0, os.ErrDeadlineExceeded }
func (silentConn) SetReadDeadline(time.Time) error { return nil }
func (silentConn) Close() error                    { return nil }

func (n *fakeNode) verifyOptions() VerifyOptions {
	return VerifyOptions{Dial: n.dial, Timeout: 100 * time.Millisecond,
		LocalAddrs:        func() ([]netip.Addr, error) { return addrs("127.0.0.1", "10.0.0.5"), nil },
		DefaultRouteAddrs: func() ([]netip.Addr, error) { return addrs("10.0.0.5"), nil }}
}

// A mode that programs ClusterIPs but not NodePorts is not proven: each
// NodePort address is its own probe, proven only by the counters moving in
// its own round, so the ClusterIP probe's count does not prove it.
func TestVerifyFailsAModeThatProgramsClusterIPsButNotNodePorts(t *testing.T) {
	for _, skip := range []bool{false, true} {
		t.Run(fmt.Sprintf("NodePort rules skipped: %v", skip), func(t *testing.T) {
			n := &fakeNode{}
			b := &countingBackend{mode: proxy.ModeUserspace, node: n, skipNodePorts: skip}
			st := verifyState()
			if err := b.Sync(context.Background(), st); err != nil {
				t.Fatal(err)
			}
			v, err := VerifyServices(context.Background(), st, b, n.verifyOptions())
			if err != nil {
				t.Fatal(err)
			}
			wantAddrs := map[string]int{"ClusterIP": 5, "NodePort": 3, "externalIP": 1, "LoadBalancer IP": 1}
			if skip {
				// web's later addresses are not probed once its NodePort
				// failed.
				wantAddrs = map[string]int{"ClusterIP": 5, "NodePort": 3}
				for _, want := range []string{
					"demo/web:http TCP externalIP 192.0.2.10:80: not probed, an earlier address of it was not carried",
					"demo/web:http TCP LoadBalancer IP 203.0.113.7:80: not probed, an earlier address of it was not carried",
				} {
					if !slices.Contains(v.Skipped, want) {
						t.Errorf("skipped lacks %q: %q", want, v.Skipped)
					}
				}
			}
			if fmt.Sprint(v.Addresses) != fmt.Sprint(wantAddrs) {
				t.Errorf("probes by kind %v, want %v", v.Addresses, wantAddrs)
			}
			var wantFailed []string
			wantProven := 4 // web, dns, fenced, local (its ClusterIP: no endpoint of the node for its NodePort)
			if skip {
				wantFailed = []string{
					"demo/dns:dns UDP NodePort 10.0.0.5:30053: the userspace mode's counters did not move (dial udp: connection refused)",
					"demo/fenced:http TCP NodePort 10.0.0.5:30081: the userspace mode's counters did not move (dial tcp: connection refused)",
					"demo/web:http TCP NodePort 10.0.0.5:30080: the userspace mode's counters did not move (dial tcp: connection refused)",
				}
				wantProven = 1
			}
			if !slices.Equal(v.Failed, wantFailed) || v.ServicePorts != wantProven {
				t.Errorf("proven %d, failed:\n%s\nwant %d, failed:\n%s", v.ServicePorts, strings.Join(v.Failed, "\n"),
					wantProven, strings.Join(wantFailed, "\n"))
			}
		})
	}
}

// A switch to a mode that programs ClusterIPs but not NodePorts fails at
// verify: the new mode's rules are removed and the old mode keeps serving
// every address, NodePorts included.
func TestSwitchToAModeWithoutNodePortsFailsAndTheOldModeKeepsServing(t *testing.T) {
	for _, skip := range []bool{false, true} {
		t.Run(fmt.Sprintf("NodePort rules skipped: %v", skip), func(t *testing.T) {
			n := &fakeNode{}
			old := &countingBackend{mode: proxy.ModeNFTables, node: n}
			var built *countingBackend
			s := NewSwitcher(SwitcherConfig{
				Initial: old, InitialTarget: proxy.Target{Mode: proxy.ModeNFTables},
				Build: func(_ context.Context, t proxy.Target) (proxy.Backend, proxy.Target, error) {
					built = &countingBackend{mode: t.Mode, node: n, skipNodePorts: skip}
					return built, t, nil
				},
				Retire: func(ctx context.Context, running proxy.Target, _ *proxy.State, _ bool) (int, error) {
					for _, b := range slices.Clone(n.backends) {
						if b.mode != running.Mode {
							_ = b.Cleanup(ctx)
						}
					}
					return 0, nil
				},
				Verify: func(ctx context.Context, st *proxy.State, b proxy.Backend) (*statusapi.Verification, error) {
					return VerifyServices(ctx, st, b, n.verifyOptions())
				},
			})
			ctx, st := context.Background(), verifyState()
			if err := s.Sync(ctx, st); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Request(proxy.Target{Mode: proxy.ModeUserspace}, "test"); err != nil {
				t.Fatal(err)
			}
			if err := s.Sync(ctx, st); err != nil {
				t.Fatal(err)
			}
			m := s.Migration()
			if !skip {
				if m.Phase != statusapi.MigrationSucceeded || s.Mode() != proxy.ModeUserspace {
					t.Fatalf("phase %s (%s), mode %s; want the switch to userspace done", m.Phase, m.Error, s.Mode())
				}
				return
			}
			if m.Phase != statusapi.MigrationFailed || s.Mode() != proxy.ModeNFTables ||
				!strings.Contains(m.Error, "NodePort 10.0.0.5:30053") || !strings.Contains(m.Error, "nftables keeps serving") {
				t.Fatalf("phase %s (%s), mode %s; want failed at verify naming the NodePort, nftables kept", m.Phase, m.Error, s.Mode())
			}
			if !slices.Equal(n.backends, []*countingBackend{old}) {
				t.Errorf("the kernel holds %d backends' rules, want only the old mode's", len(n.backends))
			}
			if _, err := n.dial(ctx, "tcp", "10.0.0.5:30080"); err != nil {
				t.Errorf("the old mode no longer serves the NodePort: %v", err)
			}
		})
	}
}
