package nft

import (
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
)

// maxObjectName is the kernel's limit on nftables chain, set and object
// names: NFT_NAME_MAXLEN (256) bytes including the terminating NUL.
const maxObjectName = 255

// commentRE finds the comments of a rule in nft syntax.
var commentRE = regexp.MustCompile(`comment "([^"]*)"`)

// TestObjectNamesAreUniqueAndFitTheKernel renders Services whose names
// would collide under a hash or truncation, at the longest lengths the
// API allows (namespace, name and port name 63 characters, SCTP, the
// longest IPv6 endpoint), and checks on the fake kernel that every Service
// and endpoint got its own chain, every name fits, and every comment fits
// the nft CLI (TestKernelLongestNamesLoadListAndReload: the real kernel).
func TestObjectNamesAreUniqueAndFitTheKernel(t *testing.T) {
	long := strings.Repeat("x", 62)
	ns1, ns2 := long+"a", long+"b" // differ only in the last character
	type svcDef struct {
		ns, name string
		ports    []v1.ServicePort
	}
	portsOf := func(names ...string) []v1.ServicePort {
		var out []v1.ServicePort
		for i, n := range names {
			out = append(out, v1.ServicePort{Name: n, Port: int32(65535 - i), NodePort: int32(32767 - i), Protocol: v1.ProtocolSCTP})
		}
		return out
	}
	maxPort := "p" + strings.Repeat("0", 62) // 63 characters, a DNS-1123 label
	defs := []svcDef{
		{ns1, long + "a", portsOf(maxPort, "p"+strings.Repeat("0", 61)+"1")},
		{ns1, long + "b", portsOf(maxPort)},
		{ns2, long + "a", portsOf(maxPort)},
		// "a-b/c" and "a/b-c": a naive join with "-" would collide.
		{"a-b", "c", portsOf("http")},
		{"a", "b-c", portsOf("http")},
		// A named and an unnamed port with the same number and protocol.
		{"a", "d", []v1.ServicePort{{Port: 80, NodePort: 30080, Protocol: v1.ProtocolTCP}}},
		{"a", "e", []v1.ServicePort{{Name: "p80", Port: 80, NodePort: 30081, Protocol: v1.ProtocolTCP}, {Name: "u80", Port: 80, NodePort: 30082, Protocol: v1.ProtocolUDP}}},
	}
	endpoints := []proxy.Endpoint{
		{IP: netip.MustParseAddr("255.255.255.255"), Port: 65535, Ready: true, Serving: true},
		{IP: netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe"), Port: 65535, Ready: true, Serving: true},
		{IP: netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"), Port: 65535, Ready: true, Serving: true},
	}

	st := &proxy.State{Generation: 1, Services: map[proxy.ServicePortName]*proxy.ServicePort{},
		Endpoints: map[proxy.ServicePortName][]proxy.Endpoint{}, Changed: map[proxy.ServicePortName]struct{}{},
		Node: proxy.Node{Name: "node", IPs: []netip.Addr{netip.MustParseAddr("192.168.0.2"), netip.MustParseAddr("fd00::2")}}}
	for i, d := range defs {
		svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: d.name}, Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeNodePort,
			ClusterIPs: []string{fmt.Sprintf("10.96.0.%d", i+1), fmt.Sprintf("fd00:96::%x", i+1)},
			Ports:      d.ports,
		}}
		sps, err := proxy.ServicePortsFromService(svc)
		if err != nil {
			t.Fatalf("%s/%s: the API would accept it, so must kp: %v", d.ns, d.name, err)
		}
		for _, sp := range sps {
			// Session affinity: a set per endpoint, named after it.
			sp.AffinityTimeout = 3 * time.Hour
			st.Services[sp.Name] = sp
			st.Endpoints[sp.Name] = endpoints
			st.Changed[sp.Name] = struct{}{}
		}
	}

	fake := NewFake()
	b := newFakeBackend(t, fake)
	mustSync(t, b, st)

	for fam, table := range fake.Tables {
		svcChains := 0
		for name, rules := range table.Chains {
			if len(name) > maxObjectName {
				t.Errorf("%s chain name of %d bytes: %s", fam, len(name), name)
			}
			for _, r := range rules {
				for _, m := range commentRE.FindAllStringSubmatch(r, -1) {
					if len(m[1]) > maxComment {
						t.Errorf("%s chain %s: comment of %d bytes: %s", fam, name, len(m[1]), m[1])
					}
				}
			}
			switch {
			case strings.HasPrefix(name, "svc-"):
				svcChains++
			}
		}
		affinitySets := 0
		for name := range table.Sets {
			if strings.HasPrefix(name, "affinity-") {
				affinitySets++
			}
			if len(name) > maxObjectName {
				t.Errorf("%s set name of %d bytes: %s", fam, len(name), name)
			}
			if c := table.Sets[name].Comment; len(c) > maxComment {
				t.Errorf("%s set %s: comment of %d bytes: %s", fam, name, len(c), c)
			}
			for _, e := range table.Elements[name] {
				if len(e.Comment) > maxComment {
					t.Errorf("%s set %s: element comment of %d bytes: %s", fam, name, len(e.Comment), e.Comment)
				}
			}
		}
		for name := range table.Counters {
			if len(name) > maxObjectName {
				t.Errorf("%s counter name of %d bytes: %s", fam, len(name), name)
			}
		}
		perFamily := map[string]int{"ip": 1, "ip6": 2}[fam]
		if svcChains != len(st.Services) || affinitySets != len(st.Services)*perFamily {
			t.Errorf("%s: %d service chains and %d endpoint affinity sets for %d service ports with %d endpoints each: names collide",
				fam, svcChains, affinitySets, len(st.Services), perFamily)
		}
	}
}

// TestServiceOf5000EndpointsRenders checks a Service with 5,000 endpoints
// goes into one transaction the fake kernel accepts, every endpoint with
// its own rule, and that removing one touches little.
func TestServiceOf5000EndpointsRenders(t *testing.T) {
	fake := NewFake()
	b := newFakeBackend(t, fake)
	w := newWorld()
	web := statetest.PortName("demo", "big", "http", v1.ProtocolTCP)
	var eps []string
	for i := 0; i < 5000; i++ {
		eps = append(eps, fmt.Sprintf("10.244.%d.%d:8080", i/250, i%250+1))
	}
	w.AddService(web, "10.96.0.10", 80, 30080, eps...)
	mustSync(t, b, w.Next())
	if n := len(fake.Tables["ip"].Elements[mapEndpoints]); n != 5000 {
		t.Fatalf("%d endpoint slots, want 5000", n)
	}
	if rules := fake.Tables["ip"].Chains["pick-svc-demo/big/tcp/http"]; len(rules) != 1 ||
		!strings.Contains(rules[0], "numgen random mod 5000 offset ") {
		t.Errorf("endpoint selection is not over all 5000 endpoints: %q", rules)
	}
	w.SetEndpoints(web, eps[1:]...)
	mustSync(t, b, w.Next())
	if strings.Contains(fake.Dump(), "10.244.0.1 . 8080") {
		t.Error("the removed endpoint is still there")
	}
}
