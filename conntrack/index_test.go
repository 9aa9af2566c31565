package conntrack

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/proxytest"
	"github.com/kpproxy/kp/proxy/statetest"
)

var (
	dnsName  = statetest.PortName("kube-system", "dns", "dns", v1.ProtocolUDP)
	dnsTCP   = statetest.PortName("kube-system", "dns", "dns-tcp", v1.ProtocolTCP)
	gameName = statetest.PortName("games", "game", "", v1.ProtocolUDP)
	sigName  = statetest.PortName("tel", "sig", "sctp", v1.ProtocolSCTP)
)

// testState: a UDP DNS Service on a ClusterIP (dual-stack), its TCP twin,
// a UDP NodePort Service with an external IP and a LoadBalancer IP, and an
// SCTP Service.
func testState() *proxy.State {
	return &proxy.State{
		Generation: 7,
		Node:       proxy.Node{Name: "node", IPs: proxytest.Addrs("192.168.1.10")},
		Services: map[proxy.ServicePortName]*proxy.ServicePort{
			dnsName: {Name: dnsName, ClusterIPs: proxytest.Addrs("10.96.0.10", "fd00:96::10"), Port: 53, Protocol: v1.ProtocolUDP},
			dnsTCP:  {Name: dnsTCP, ClusterIPs: proxytest.Addrs("10.96.0.10"), Port: 53, Protocol: v1.ProtocolTCP},
			gameName: {Name: gameName, ClusterIPs: proxytest.Addrs("10.96.0.20"), Port: 7777, Protocol: v1.ProtocolUDP, NodePort: 30777,
				ExternalIPs: proxytest.Addrs("203.0.113.5"), LoadBalancerIPs: proxytest.Addrs("198.51.100.7")},
			sigName: {Name: sigName, ClusterIPs: proxytest.Addrs("10.96.0.30"), Port: 3868, Protocol: v1.ProtocolSCTP},
		},
		Endpoints: map[proxy.ServicePortName][]proxy.Endpoint{
			dnsName:  {statetest.Endpoint("10.244.1.2:5353"), statetest.Endpoint("10.244.1.3:5353"), statetest.Endpoint("10.244.1.4:5353", statetest.Terminating), statetest.Endpoint("10.244.1.5:5353", statetest.NotReady), statetest.Endpoint("[fd00:244::2]:5353")},
			dnsTCP:   {statetest.Endpoint("10.244.1.2:5353")},
			gameName: {statetest.Endpoint("10.244.2.2:7000")},
			sigName:  {statetest.Endpoint("10.244.3.2:3868")},
		},
	}
}

// flow builds a flow from client to dst, answered by replySrc; masquerade
// (reply destination) is left out: attribution does not look at it.
func flow(proto uint8, client, dst, replySrc string) Flow {
	c := netip.MustParseAddrPort(client)
	return Flow{
		Protocol: proto,
		Orig:     Tuple{Src: c, Dst: netip.MustParseAddrPort(dst)},
		Reply:    Tuple{Src: netip.MustParseAddrPort(replySrc), Dst: c},
	}
}

func TestIndexAttributesFlowsToServicePortAndEndpoint(t *testing.T) {
	ix := NewIndex(testState(), proxytest.Addrs("10.0.2.1"))
	for _, tt := range []struct {
		name       string
		f          Flow
		want       proxy.ServicePortName
		via        Via
		endpoint   string
		known      bool
		notMatched bool
	}{
		{name: "udp to a ClusterIP is the UDP port, answered by a known endpoint",
			f:    flow(ProtoUDP, "10.244.9.9:40000", "10.96.0.10:53", "10.244.1.3:5353"),
			want: dnsName, via: ViaClusterIP, endpoint: "10.244.1.3:5353", known: true},
		{name: "tcp to the same address and port is the TCP port",
			f:    flow(ProtoTCP, "10.244.9.9:40000", "10.96.0.10:53", "10.244.1.2:5353"),
			want: dnsTCP, via: ViaClusterIP, endpoint: "10.244.1.2:5353", known: true},
		{name: "ipv6 ClusterIP",
			f:    flow(ProtoUDP, "[fd00:244::9]:40000", "[fd00:96::10]:53", "[fd00:244::2]:5353"),
			want: dnsName, via: ViaClusterIP, endpoint: "[fd00:244::2]:5353", known: true},
		{name: "an endpoint that is gone is reported, not known",
			f:    flow(ProtoUDP, "10.244.9.9:40000", "10.96.0.10:53", "10.244.1.99:5353"),
			want: dnsName, via: ViaClusterIP, endpoint: "10.244.1.99:5353"},
		{name: "a known address on another port is not the endpoint",
			f:    flow(ProtoUDP, "10.244.9.9:40000", "10.96.0.10:53", "10.244.1.2:5354"),
			want: dnsName, via: ViaClusterIP, endpoint: "10.244.1.2:5354"},
		{name: "a flow never DNATed has the Service address as its endpoint",
			f:    flow(ProtoUDP, "10.244.9.9:40000", "10.96.0.10:53", "10.96.0.10:53"),
			want: dnsName, via: ViaClusterIP, endpoint: "10.96.0.10:53"},
		{name: "NodePort on the node's primary IP",
			f:    flow(ProtoUDP, "10.0.2.2:40000", "192.168.1.10:30777", "10.244.2.2:7000"),
			want: gameName, via: ViaNodePort, endpoint: "10.244.2.2:7000", known: true},
		{name: "NodePort on another local address",
			f:    flow(ProtoUDP, "10.0.2.2:40000", "10.0.2.1:30777", "10.244.2.2:7000"),
			want: gameName, via: ViaNodePort, endpoint: "10.244.2.2:7000", known: true},
		{name: "external IP",
			f:    flow(ProtoUDP, "10.0.2.2:40000", "203.0.113.5:7777", "10.244.2.2:7000"),
			want: gameName, via: ViaExternalIP, endpoint: "10.244.2.2:7000", known: true},
		{name: "LoadBalancer IP",
			f:    flow(ProtoUDP, "10.0.2.2:40000", "198.51.100.7:7777", "10.244.2.2:7000"),
			want: gameName, via: ViaLoadBalancerIP, endpoint: "10.244.2.2:7000", known: true},
		{name: "SCTP",
			f:    flow(ProtoSCTP, "10.244.9.9:40000", "10.96.0.30:3868", "10.244.3.2:3868"),
			want: sigName, via: ViaClusterIP, endpoint: "10.244.3.2:3868", known: true},
		{name: "the NodePort's number on an address that is not the node's is no Service",
			f: flow(ProtoUDP, "10.0.2.2:40000", "10.0.3.3:30777", "10.0.3.3:30777"), notMatched: true},
		{name: "the NodePort's number with the wrong protocol is no Service",
			f: flow(ProtoTCP, "10.0.2.2:40000", "192.168.1.10:30777", "192.168.1.10:30777"), notMatched: true},
		{name: "a ClusterIP on a port the Service does not have is no Service",
			f: flow(ProtoUDP, "10.244.9.9:40000", "10.96.0.10:54", "10.96.0.10:54"), notMatched: true},
		{name: "a pod talking to a pod is no Service",
			f: flow(ProtoUDP, "10.244.9.9:40000", "10.244.1.2:5353", "10.244.1.2:5353"), notMatched: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, ok := ix.Attribute(tt.f)
			if ok == tt.notMatched {
				t.Fatalf("attributed = %v (%+v), want %v", ok, a, !tt.notMatched)
			}
			if tt.notMatched {
				return
			}
			if a.ServicePort != tt.want || a.Via != tt.via || a.Endpoint.String() != tt.endpoint || a.Known != tt.known {
				t.Errorf("got %s via %s → %s known=%v; want %s via %s → %s known=%v",
					a.ServicePort, a.Via, a.Endpoint, a.Known, tt.want, tt.via, tt.endpoint, tt.known)
			}
		})
	}
}

func TestFlowStateNamesFollowConntrackTool(t *testing.T) {
	udp := flow(ProtoUDP, "10.0.0.1:1", "10.0.0.2:2", "10.0.0.2:2")
	replied, assured := udp, udp
	replied.Status = 1 << 1
	assured.Status = 1<<1 | 1<<2
	tcp := flow(ProtoTCP, "10.0.0.1:1", "10.0.0.2:2", "10.0.0.2:2")
	tcp.ProtoState = 3
	timeWait := tcp
	timeWait.ProtoState = 7
	sctp := flow(ProtoSCTP, "10.0.0.1:1", "10.0.0.2:2", "10.0.0.2:2")
	sctp.ProtoState = 4
	for _, tt := range []struct {
		f    Flow
		want string
	}{{udp, "UNREPLIED"}, {replied, "REPLIED"}, {assured, "ASSURED"}, {tcp, "ESTABLISHED"}, {timeWait, "TIME_WAIT"}, {sctp, "ESTABLISHED"}} {
		if got := tt.f.State(); got != tt.want {
			t.Errorf("%s state %d status %b: State() = %s, want %s", tt.f.ProtocolName(), tt.f.ProtoState, tt.f.Status, got, tt.want)
		}
	}
}
