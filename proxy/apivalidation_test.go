package proxy

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/kpproxy/kp/proxy/proxytest"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
)

// The rule these tests hold kp to: every Service and EndpointSlice the API
// server (k8s.io/kubernetes v1.36 validation, every feature gate setting, and
// objects older API servers stored) accepts, kp accepts; kp refuses only
// what it cannot program, naming the object and field.

// TestServiceFieldsTheAPIServerAcceptsAreProgrammed converts Services at the
// edges of the API server's validation and checks each gives its ports
// without an error.
func TestServiceFieldsTheAPIServerAcceptsAreProgrammed(t *testing.T) {
	label63 := "p" + strings.Repeat("0123456789", 6) + "yz" // 63: the longest DNS-1123 label
	lbSvc := func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Spec.Ports[0].NodePort = 30080
	}
	tests := []struct {
		name string
		ns   string
		svc  string
		mut  func(*v1.Service)
		// check inspects the single port converted (nil: only that there
		// is one and no error).
		check func(t *testing.T, sp *ServicePort)
	}{
		{
			// validateServicePort: ValidateDNS1123Label, not the
			// 15-character IANA service name of container ports.
			name: "port name of 63 characters",
			mut:  func(s *v1.Service) { s.Spec.Ports[0].Name = label63 },
			check: func(t *testing.T, sp *ServicePort) {
				if sp.Name.Port != label63 {
					t.Errorf("port name %q", sp.Name.Port)
				}
			},
		},
		{name: "port name of 16 characters", mut: func(s *v1.Service) { s.Spec.Ports[0].Name = "a-very-long-name" }},
		{name: "port name of digits only", mut: func(s *v1.Service) { s.Spec.Ports[0].Name = "8080" }},
		{name: "port name with a double hyphen", mut: func(s *v1.Service) { s.Spec.Ports[0].Name = "http--alt" }},
		{name: "port name starting with a digit", mut: func(s *v1.Service) { s.Spec.Ports[0].Name = "9http" }},
		// RelaxedServiceNameValidation (beta, on by default in 1.36): a
		// Service name is a DNS-1123 label, so it may start with a digit.
		{name: "Service name starting with a digit", svc: "1web"},
		{name: "Service name of digits only", svc: "123"},
		{name: "Service name and namespace of 63 characters", ns: label63, svc: "s" + label63[1:]},
		{name: "port 1", mut: func(s *v1.Service) { s.Spec.Ports[0].Port = 1 }},
		{name: "port 65535", mut: func(s *v1.Service) { s.Spec.Ports[0].Port = 65535 }},
		{
			// The node port range is the API server's flag: kp assumes none.
			name: "node port outside the default range",
			mut: func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeNodePort
				s.Spec.Ports[0].NodePort = 80
			},
			check: func(t *testing.T, sp *ServicePort) {
				if sp.NodePort != 80 {
					t.Errorf("node port %d", sp.NodePort)
				}
			},
		},
		{
			// IsValidCIDRForLegacyField without StrictIPCIDRValidation
			// (and values stored before it): leading zeros in the address
			// and the length, host bits set, padding.
			name: "source ranges in the legacy forms",
			mut: func(s *v1.Service) {
				lbSvc(s)
				s.Spec.LoadBalancerSourceRanges = []string{"010.000.000.000/08", "192.0.2.7/24", " 198.51.100.0/24 ", "::ffff:203.0.113.0/120", "2001:db8::1/32"}
			},
			check: func(t *testing.T, sp *ServicePort) {
				want := []netip.Prefix{
					netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.0/24"),
					netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("203.0.113.0/24"),
					netip.MustParsePrefix("2001:db8::/32"),
				}
				if !slices.Equal(sp.LoadBalancerSourceRanges, want) {
					t.Errorf("source ranges %v, want %v", sp.LoadBalancerSourceRanges, want)
				}
			},
		},
		{
			name: "source ranges annotation in the legacy forms",
			mut: func(s *v1.Service) {
				lbSvc(s)
				s.Annotations = map[string]string{v1.AnnotationLoadBalancerSourceRangesKey: " 010.0.0.0/8 ,192.0.2.7/24"}
			},
			check: func(t *testing.T, sp *ServicePort) {
				want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.0/24")}
				if !slices.Equal(sp.LoadBalancerSourceRanges, want) {
					t.Errorf("source ranges %v, want %v", sp.LoadBalancerSourceRanges, want)
				}
			},
		},
		{
			// IsValidIPForLegacyField without strict validation:
			// ParseIPSloppy reads any number of leading zeros, also in
			// the dotted tail of an IPv6 address.
			name: "external IPs in the legacy forms",
			mut:  func(s *v1.Service) { s.Spec.ExternalIPs = []string{"0010.001.2.3", "::ffff:010.1.2.4", "203.0.113.5"} },
			check: func(t *testing.T, sp *ServicePort) {
				if want := proxytest.Addrs("10.1.2.3", "10.1.2.4", "203.0.113.5"); !slices.Equal(sp.ExternalIPs, want) {
					t.Errorf("external IPs %v, want %v", sp.ExternalIPs, want)
				}
			},
		},
		{
			name: "session affinity of a day",
			mut: func(s *v1.Service) {
				s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](86400)}}
			},
		},
		{name: "traffic distribution PreferSameNode", mut: func(s *v1.Service) { s.Spec.TrafficDistribution = ptr.To(v1.ServiceTrafficDistributionPreferSameNode) }},
		{
			// Unknown values pass the API only behind gates to come: kp,
			// as upstream kube-proxy, treats them as unset.
			name: "unknown traffic distribution",
			mut:  func(s *v1.Service) { s.Spec.TrafficDistribution = ptr.To("PreferSomewhereElse") },
			check: func(t *testing.T, sp *ServicePort) {
				eps := []Endpoint{Endpoint{IP: netip.MustParseAddr("10.0.0.1"), Ready: true}.At("node", "z1")}
				if got := derivedHints(sp, eps); got[0].Hints != nil {
					t.Errorf("an unknown trafficDistribution derived hints: %+v", got[0])
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns, name := cmp.Or(tt.ns, "ns"), cmp.Or(tt.svc, "web")
			svc := proxytest.Service(ns, name)
			if tt.mut != nil {
				tt.mut(svc)
			}
			got, err := ServicePortsFromService(svc)
			if err != nil {
				t.Fatalf("the API server accepts it, kp refused: %v", err)
			}
			if len(got) != 1 {
				t.Fatalf("got %d ports, want 1:%s", len(got), fmtPorts(got))
			}
			if tt.check != nil {
				tt.check(t, got[0])
			}
		})
	}
}

// TestServiceFieldsNoAPIServerAcceptsAreRefusedByField checks that what no
// API server accepts, and kp could not name safely in the kernel, is still
// refused (manifests skip the API server), with the field named.
func TestServiceFieldsNoAPIServerAcceptsAreRefusedByField(t *testing.T) {
	tests := []struct {
		name      string
		ns, svc   string
		mut       func(*v1.Service)
		wantField string
	}{
		{name: "port name of 64 characters", mut: func(s *v1.Service) { s.Spec.Ports[0].Name = strings.Repeat("p", 64) }, wantField: "spec.ports[0].name"},
		{name: "port name with a slash", mut: func(s *v1.Service) { s.Spec.Ports[0].Name = "a/b" }, wantField: "spec.ports[0].name"},
		{name: "port name in capitals", mut: func(s *v1.Service) { s.Spec.Ports[0].Name = "HTTP" }, wantField: "spec.ports[0].name"},
		{name: "port name ending in a hyphen", mut: func(s *v1.Service) { s.Spec.Ports[0].Name = "http-" }, wantField: "spec.ports[0].name"},
		{name: "Service name of 64 characters", svc: strings.Repeat("s", 64), wantField: "metadata.name"},
		{name: "Service name with a dot", svc: "web.v2", wantField: "metadata.name"},
		{name: "namespace of 64 characters", ns: strings.Repeat("n", 64), wantField: "metadata.namespace"},
		{name: "source range with a length past the family", mut: func(s *v1.Service) { s.Spec.LoadBalancerSourceRanges = []string{"10.0.0.0/33"} }, wantField: "spec.loadBalancerSourceRanges[0]"},
		{name: "source range without a length", mut: func(s *v1.Service) { s.Spec.LoadBalancerSourceRanges = []string{"10.0.0.0"} }, wantField: "spec.loadBalancerSourceRanges[0]"},
		{name: "source range octet above 255", mut: func(s *v1.Service) { s.Spec.LoadBalancerSourceRanges = []string{"10.0.0.256/32"} }, wantField: "spec.loadBalancerSourceRanges[0]"},
		{
			// Not a Service the API server admits (several ports, one
			// unnamed): from manifests, the two would name the same chains.
			name: "an unnamed port and a port named by its number",
			mut: func(s *v1.Service) {
				s.Spec.Ports = []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP}, {Name: "80", Port: 8080, Protocol: v1.ProtocolTCP}}
			},
			wantField: "spec.ports[1].name",
		},
		{name: "external IP octet above 255 after leading zeros", mut: func(s *v1.Service) { s.Spec.ExternalIPs = []string{"10.0.0.0256"} }, wantField: "spec.externalIPs[0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := proxytest.Service(cmp.Or(tt.ns, "ns"), cmp.Or(tt.svc, "web"))
			if tt.mut != nil {
				tt.mut(svc)
			}
			_, err := ServicePortsFromService(svc)
			fields := errFields(t, unjoin(err))
			if len(fields) != 1 || !strings.HasSuffix(fields[0], " "+tt.wantField) {
				t.Errorf("errors %q, want one naming %s (%v)", fields, tt.wantField, err)
			}
		})
	}
}

// TestEndpointSliceFieldsTheAPIServerAcceptsAreProgrammed: slice port names
// are DNS-1123 labels like the Service's, slice names DNS subdomains; kp
// matches a 63-character port name and does not check the slice's name.
func TestEndpointSliceFieldsTheAPIServerAcceptsAreProgrammed(t *testing.T) {
	long := "p" + strings.Repeat("x", 62)
	sliceName := strings.Repeat("a.", 126) + "z" // 253 characters, with dots
	for _, proto := range []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP} {
		sl := proxytest.Slice("ns", sliceName, "web", []string{"10.0.0.1", "0010.0.0.2"}, func(sl *discovery.EndpointSlice) {
			sl.Ports = []discovery.EndpointPort{{Name: ptr.To(long), Protocol: ptr.To(proto), Port: ptr.To[int32](65535)}}
		})
		eps, errs := EndpointsFor(spName("ns", "web", long, proto), []*discovery.EndpointSlice{sl})
		if len(errs) > 0 {
			t.Errorf("%s: the API server accepts the slice, kp refused: %v", proto, errs)
		}
		var got []string
		for _, e := range eps {
			got = append(got, e.String())
		}
		if want := []string{"10.0.0.1:65535", "10.0.0.2:65535"}; !slices.Equal(got, want) {
			t.Errorf("%s: endpoints %v, want %v", proto, got, want)
		}
	}
}
