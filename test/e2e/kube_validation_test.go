package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kpproxy/kp/test/apiserver"
)

// TestKpProgramsEveryServiceTheAPIServerAccepts creates, through the real
// API server (so its own validation is what admits them), Services and
// EndpointSlices at the edges of what it accepts, and checks kp programs
// every one of their ports: the longest names (namespace, Service name and
// port names of 63 characters, an EndpointSlice name of 253), a Service name
// starting with a digit (RelaxedServiceNameValidation, on by default in
// 1.36), TCP, UDP and SCTP on the same port numbers, ports 1 and 65535, and
// NodePorts outside the default range (the range is the API server's flag),
// and addresses and source ranges in the legacy forms the API server admits
// without StrictIPCIDRValidation (off before 1.36, and what it stored then
// stays). TCP and UDP answer with real packets; SCTP (no sockets in this
// kernel) is checked as rules.
func TestKpProgramsEveryServiceTheAPIServerAccepts(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		k := newKubeEnv(t, m, 3, apiserver.Options{NodePortRange: "10000-65535", FeatureGates: "StrictIPCIDRValidation=false"})
		all := k.w.Pods()
		// outside is a client outside the legacy Service's source ranges.
		pods, outside := all[:2], all[2]
		label := func(c string) string { return c + strings.Repeat("0", 61) + c } // 63 characters
		longNS := label("n")
		if _, err := k.api.CoreV1().Namespaces().Create(k.ctx(), &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: longNS}}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create namespace of 63 characters: %v", err)
		}

		type port struct {
			name     string
			proto    v1.Protocol
			port     int32
			nodePort int32 // 0: the API server allocates one
			target   int32
		}
		targets := map[v1.Protocol]int32{v1.ProtocolTCP: 8080, v1.ProtocolUDP: 5353, v1.ProtocolSCTP: 9000}
		var edgePorts []port
		for _, proto := range []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP} {
			for _, n := range []int32{1, 80, 65535} {
				// Port names are unique in a Service: the protocol and number
				// tell them apart, the zeros make them 63 characters long.
				name := fmt.Sprintf("%s-%d-", strings.ToLower(string(proto)), n)
				name += strings.Repeat("0", 62-len(name)) + "p"
				p := port{name: name, proto: proto, port: n, target: targets[proto]}
				if n == 65535 {
					p.nodePort = 65535 // above the default range; one number for three protocols
				}
				edgePorts = append(edgePorts, p)
			}
		}
		type service struct {
			ns, name, clusterIP string
			typ                 v1.ServiceType
			ports               []port
			sliceName           string
		}
		sliceName := label("a") + "." + label("b") + "." + label("c") + "." + strings.Repeat("d", 61) // 253 characters
		services := []service{
			{ns: longNS, name: label("s"), clusterIP: "10.96.0.71", typ: v1.ServiceTypeNodePort, ports: edgePorts, sliceName: sliceName},
			{ns: "e2e", name: "7web", clusterIP: "10.96.0.72", typ: v1.ServiceTypeClusterIP, sliceName: "7web",
				ports: []port{{name: "a-very-long-name", proto: v1.ProtocolTCP, port: 80, target: 8081}}},
		}
		if len(sliceName) != 253 {
			t.Fatalf("slice name of %d characters", len(sliceName))
		}

		node := nodeName
		for _, s := range services {
			svc := &v1.Service{
				ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: s.name},
				Spec:       v1.ServiceSpec{Type: s.typ, ClusterIP: s.clusterIP, ClusterIPs: []string{s.clusterIP}},
			}
			slice := &discovery.EndpointSlice{
				ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: s.sliceName, Labels: map[string]string{
					discovery.LabelServiceName: s.name, discovery.LabelManagedBy: "e2e.kp.test"}},
				AddressType: discovery.AddressTypeIPv4,
			}
			for _, p := range s.ports {
				svc.Spec.Ports = append(svc.Spec.Ports, v1.ServicePort{Name: p.name, Protocol: p.proto, Port: p.port,
					NodePort: p.nodePort, TargetPort: intstr.FromInt32(p.target)})
				slice.Ports = append(slice.Ports, discovery.EndpointPort{Name: &p.name, Protocol: &p.proto, Port: &p.target})
			}
			for _, pod := range pods {
				slice.Endpoints = append(slice.Endpoints, discovery.Endpoint{Addresses: []string{pod.IP.String()}, NodeName: &node})
			}
			if _, err := k.api.CoreV1().Services(s.ns).Create(k.ctx(), svc, metav1.CreateOptions{}); err != nil {
				t.Fatalf("the API server refused Service %s/%s: %v", s.ns, s.name, err)
			}
			if _, err := k.api.DiscoveryV1().EndpointSlices(s.ns).Create(k.ctx(), slice, metav1.CreateOptions{}); err != nil {
				t.Fatalf("the API server refused EndpointSlice %s/%s: %v", s.ns, s.sliceName, err)
			}
		}
		// Legacy forms: leading zeros (read as decimal, as upstream's
		// ParseIPSloppy reads them), host bits set in a source range.
		sloppy := func(a netip.Addr) string {
			b := a.As4()
			return fmt.Sprintf("%03d.%03d.%03d.%03d", b[0], b[1], b[2], b[3])
		}
		const legacyLB, legacyExt = "10.96.200.3", "10.96.201.3"
		legacy := &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "e2e", Name: "legacy"},
			Spec: v1.ServiceSpec{
				Type: v1.ServiceTypeLoadBalancer, ClusterIP: "10.96.0.73", ClusterIPs: []string{"10.96.0.73"},
				ExternalIPs:              []string{sloppy(netip.MustParseAddr(legacyExt))},
				LoadBalancerSourceRanges: []string{" " + sloppy(k.w.ClientIP()) + "/032 ", "10.255.1.7/24"},
				Ports:                    []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}},
			},
		}
		created, err := k.api.CoreV1().Services("e2e").Create(k.ctx(), legacy, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("the API server (StrictIPCIDRValidation off) refused the legacy forms: %v", err)
		}
		vip := v1.LoadBalancerIPModeVIP
		created.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: sloppy(netip.MustParseAddr(legacyLB)), IPMode: &vip}}
		if _, err := k.api.CoreV1().Services("e2e").UpdateStatus(k.ctx(), created, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("the API server refused a load balancer ingress IP with leading zeros: %v", err)
		}
		legacySlice := &discovery.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: "e2e", Name: "legacy-1", Labels: map[string]string{
				discovery.LabelServiceName: "legacy", discovery.LabelManagedBy: "e2e.kp.test"}},
			AddressType: discovery.AddressTypeIPv4,
			Ports:       []discovery.EndpointPort{{Name: ptr("http"), Protocol: ptr(v1.ProtocolTCP), Port: ptr[int32](8080)}},
		}
		for _, pod := range pods {
			legacySlice.Endpoints = append(legacySlice.Endpoints, discovery.Endpoint{Addresses: []string{sloppy(pod.IP)}, NodeName: &node})
		}
		if _, err := k.api.DiscoveryV1().EndpointSlices("e2e").Create(k.ctx(), legacySlice, metav1.CreateOptions{}); err != nil {
			t.Fatalf("the API server refused endpoint addresses with leading zeros: %v", err)
		}

		k.startKP()

		// Real packets: every TCP and UDP port of the 63-character names, on
		// the ClusterIP and (port 65535) the NodePort, and the digit-first
		// Service.
		names := k.podNames(pods...)
		for _, p := range edgePorts {
			if p.proto == v1.ProtocolSCTP {
				continue
			}
			network := strings.ToLower(string(p.proto))
			k.answers(k.w.Client(), network, hostPort("10.96.0.71", int(p.port)), names...)
			if p.nodePort != 0 {
				k.answers(k.w.Client(), network, hostPort(k.w.NodeIP().String(), int(p.nodePort)), names...)
			}
		}
		k.answers(k.w.Client(), "tcp", "10.96.0.72:80", names...)
		k.answers(k.w.Client(), "tcp", legacyLB+":80", names...)
		k.answers(outside.NS, "tcp", legacyExt+":80", names...)
		if err := k.dropped(outside.NS, "tcp", legacyLB+":80"); err != nil {
			t.Errorf("a client outside the legacy source ranges: %v", err)
		}

		// Every port is in kp's status API, with its endpoints, and SCTP's are
		// in the rules.
		for _, s := range services {
			k.eventually(fmt.Sprintf("status API lists every port of %s/%s", s.ns, s.name), 15*time.Second, func() error {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				st, err := k.statusClient().Services(ctx, s.ns, s.name)
				if err != nil {
					return err
				}
				var got, want []string
				for _, sp := range st.ServicePorts {
					got = append(got, fmt.Sprintf("%s %s %d endpoints=%d", sp.PortName, sp.Protocol, sp.Port, len(sp.Endpoints)))
				}
				for _, p := range s.ports {
					want = append(want, fmt.Sprintf("%s %s %d endpoints=%d", p.name, p.proto, p.port, len(pods)))
				}
				slices.Sort(got)
				slices.Sort(want)
				if !slices.Equal(got, want) {
					return fmt.Errorf("service ports\n got %q\nwant %q", got, want)
				}
				return nil
			})
		}
		if m.iptables() {
			// Upstream's layout: the ClusterIP's rule per SCTP port, its
			// comment naming the Service port, the DNAT to the first pod,
			// and the SCTP NodePort 65535.
			out := k.rules()
			for _, p := range edgePorts {
				if p.proto != v1.ProtocolSCTP {
					continue
				}
				for _, words := range [][]string{
					{"-d 10.96.0.71/32", "-p sctp", fmt.Sprintf("--dport %d ", p.port)},
					{fmt.Sprintf("%s/%s:%s", longNS, label("s"), p.name)},
					{"-p sctp", fmt.Sprintf("--to-destination %s:%d", pods[0].IP, p.target)},
				} {
					if ruleLine(out, words...) == "" {
						t.Errorf("no rule of kp's holds %q", words)
					}
				}
			}
			if ruleLine(out, "-p sctp", "--dport 65535") == "" {
				t.Errorf("no rule of kp's holds the SCTP NodePort 65535")
			}
			if t.Failed() {
				t.Logf("kp's rules:\n%s", out)
			}
		} else if m.claims(featureSCTP) {
			out, err := k.w.NFT("list", "table", "ip", "kp")
			if err != nil {
				t.Fatalf("nft list table ip kp: %v", err)
			}
			for _, p := range edgePorts {
				if p.proto != v1.ProtocolSCTP {
					continue
				}
				for _, want := range []string{
					fmt.Sprintf("10.96.0.71 . sctp . %d", p.port),
					fmt.Sprintf("chain pick-svc-%s/%s/sctp/%s", longNS, label("s"), p.name),
					"meta l4proto sctp dnat ip to ct mark map @endpoints",
					fmt.Sprintf(": %s . %d", pods[0].IP, p.target),
				} {
					if !strings.Contains(out, want) {
						t.Errorf("kp's table lacks %q", want)
					}
				}
			}
			if !strings.Contains(out, "sctp . 65535") {
				t.Errorf("kp's table lacks the SCTP NodePort 65535")
			}
		}
		// Nothing the API server admitted was refused.
		if log := k.kp.Log(); strings.Contains(log, "invalid field skipped") {
			t.Errorf("kp refused a field the API server accepted:\n%s", grepLines(log, "invalid field skipped"))
		}
	})
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

func ptr[T any](v T) *T { return &v }
