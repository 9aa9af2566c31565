package nft

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpproxy/kp/proxy"
)

// TestKernelLongestNamesLoadListAndReload programs, into a real kernel, a
// Service at the longest lengths the API server admits (namespace, name and
// three port names of 63 characters; TCP, UDP and SCTP on port 65535; every
// per-service object: affinity sets, a source-range firewall, NodePorts,
// the longest endpoint addresses), then checks the listing names each
// object in full and reloads with `nft -f` to itself.
func TestKernelLongestNamesLoadListAndReload(t *testing.T) {
	ns, _, b := kernelBackend(t)
	if err := b.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	label := func(c string) string { return c + strings.Repeat("0", 61) + c } // 63 characters
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: label("n"), Name: label("s")},
		Spec: v1.ServiceSpec{
			Type:                     v1.ServiceTypeLoadBalancer,
			ClusterIPs:               []string{"10.96.255.254", "fd00:96::ffff"},
			LoadBalancerSourceRanges: []string{"192.0.2.0/24", "2001:db8::/32"},
			SessionAffinity:          v1.ServiceAffinityClientIP,
			Ports: []v1.ServicePort{
				{Name: label("t"), Protocol: v1.ProtocolTCP, Port: 65535, NodePort: 65535},
				{Name: label("u"), Protocol: v1.ProtocolUDP, Port: 65535, NodePort: 65535},
				{Name: label("c"), Protocol: v1.ProtocolSCTP, Port: 65535, NodePort: 65535},
			},
		},
		Status: v1.ServiceStatus{LoadBalancer: v1.LoadBalancerStatus{Ingress: []v1.LoadBalancerIngress{{IP: "203.0.113.1"}, {IP: "2001:db8::1"}}}},
	}
	sps, err := proxy.ServicePortsFromService(svc)
	if err != nil || len(sps) != 3 {
		t.Fatalf("the API server accepts this Service; kp converted %d ports: %v", len(sps), err)
	}
	w := newWorld()
	w.Node.IPs = append(w.Node.IPs, netip.MustParseAddr("fd00::2"))
	for _, sp := range sps {
		sp.AffinityTimeout = 3 * time.Hour
		w.Services[sp.Name] = sp
		w.SetEndpoints(sp.Name, "255.255.255.254:65535", "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe]:65535")
	}
	mustSync(t, b, w.Next())

	listing := nftIn(t, ns, "list", "ruleset")
	for _, sp := range sps {
		base := serviceChainBase(sp)
		for _, want := range []string{"chain svc-" + base, "chain ext-" + base, "chain firewall-" + base,
			"set affinity-" + base + "__ffff.ffff.ffff.ffff.ffff.ffff.ffff.fffe/65535"} {
			if !strings.Contains(listing, want) {
				t.Errorf("the listing lacks %q", want)
			}
		}
	}
	requireReloads(t, listing)
}
