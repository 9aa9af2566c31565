package proxy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/proxy/proxytest"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// testPort is the ServicePort testService converts to, changed by muts.
func testPort(ns, name string, muts ...func(*ServicePort)) *ServicePort {
	sp := &ServicePort{
		Name:       spName(ns, name, "http", v1.ProtocolTCP),
		Type:       v1.ServiceTypeClusterIP,
		ClusterIPs: proxytest.Addrs("10.96.0.10"),
		Port:       80,
		Protocol:   v1.ProtocolTCP,
	}
	for _, m := range muts {
		m(sp)
	}
	return sp
}

func spName(ns, name, port string, proto v1.Protocol) ServicePortName {
	return ServicePortName{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}, Port: port, Protocol: proto}
}

func fmtPorts(ps []*ServicePort) string {
	var b strings.Builder
	for _, p := range ps {
		fmt.Fprintf(&b, "\n  %+v", *p)
	}
	return b.String()
}

// errFields lists "Kind ns/name field" for every FieldError in errs.
func errFields(t *testing.T, errs []error) []string {
	t.Helper()
	var out []string
	for _, err := range errs {
		var fe *FieldError
		if !errors.As(err, &fe) {
			t.Fatalf("error %v is not a *FieldError", err)
		}
		out = append(out, fmt.Sprintf("%s %s %s", fe.Kind, fe.Object, fe.Field))
	}
	return out
}

func TestServicePortsFromService(t *testing.T) {
	withPorts := func(ports ...v1.ServicePort) func(*v1.Service) {
		return func(s *v1.Service) { s.Spec.Ports = ports }
	}
	nodePortSvc := func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 30080
	}
	lbSvc := func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Spec.Ports[0].NodePort = 30080
	}
	tests := []struct {
		name       string
		svc        *v1.Service
		want       []*ServicePort
		wantErrors []string
	}{
		{
			name: "cluster IP service gives one port per spec port",
			svc: proxytest.Service("ns", "web", withPorts(
				v1.ServicePort{Name: "http", Port: 80, Protocol: v1.ProtocolTCP},
				v1.ServicePort{Name: "dns", Port: 53, Protocol: v1.ProtocolUDP},
				v1.ServicePort{Name: "sig", Port: 9000, Protocol: v1.ProtocolSCTP},
			)),
			want: []*ServicePort{
				testPort("ns", "web"),
				testPort("ns", "web", func(p *ServicePort) {
					p.Name, p.Port, p.Protocol = spName("ns", "web", "dns", v1.ProtocolUDP), 53, v1.ProtocolUDP
				}),
				testPort("ns", "web", func(p *ServicePort) {
					p.Name, p.Port, p.Protocol = spName("ns", "web", "sig", v1.ProtocolSCTP), 9000, v1.ProtocolSCTP
				}),
			},
		},
		{
			name: "headless service is ignored without error",
			svc:  proxytest.Service("ns", "web", func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", []string{"None"} }),
		},
		{
			name: "ExternalName service is ignored without error",
			svc: proxytest.Service("ns", "web", func(s *v1.Service) {
				s.Spec.Type, s.Spec.ClusterIP, s.Spec.ClusterIPs = v1.ServiceTypeExternalName, "", nil
			}),
		},
		{
			name: "service labelled for another proxy is ignored without error",
			svc: proxytest.Service("ns", "web", func(s *v1.Service) {
				s.Labels = map[string]string{LabelServiceProxyName: "someone-else"}
			}),
		},
		{
			name: "dual-stack service keeps both cluster IPs in order",
			svc:  proxytest.Service("ns", "web", func(s *v1.Service) { s.Spec.ClusterIPs = []string{"fd00::10", "10.96.0.10"} }),
			want: []*ServicePort{testPort("ns", "web", func(p *ServicePort) { p.ClusterIPs = proxytest.Addrs("fd00::10", "10.96.0.10") })},
		},
		{
			name: "clusterIP is used when clusterIPs is empty",
			svc:  proxytest.Service("ns", "web", func(s *v1.Service) { s.Spec.ClusterIPs = nil }),
			want: []*ServicePort{testPort("ns", "web")},
		},
		{
			name: "IPv4 with leading zeros is read as decimal like upstream",
			svc:  proxytest.Service("ns", "web", func(s *v1.Service) { s.Spec.ClusterIPs = []string{"010.096.000.010"} }),
			want: []*ServicePort{testPort("ns", "web")},
		},
		{
			name:       "invalid cluster IP leaves no usable port",
			svc:        proxytest.Service("ns", "web", func(s *v1.Service) { s.Spec.ClusterIPs = []string{"10.96.0.300"} }),
			wantErrors: []string{"Service ns/web spec.clusterIPs[0]"},
		},
		{
			name:       "missing cluster IP leaves no usable port",
			svc:        proxytest.Service("ns", "web", func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil }),
			wantErrors: []string{"Service ns/web spec.clusterIP"},
		},
		{
			name:       "invalid second cluster IP is skipped",
			svc:        proxytest.Service("ns", "web", func(s *v1.Service) { s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00::zz"} }),
			want:       []*ServicePort{testPort("ns", "web")},
			wantErrors: []string{"Service ns/web spec.clusterIPs[1]"},
		},
		{
			name:       "second cluster IP of the same family is skipped",
			svc:        proxytest.Service("ns", "web", func(s *v1.Service) { s.Spec.ClusterIPs = []string{"10.96.0.10", "10.96.0.11"} }),
			want:       []*ServicePort{testPort("ns", "web")},
			wantErrors: []string{"Service ns/web spec.clusterIPs[1]"},
		},
		{
			name: "port 0 drops only that port",
			svc: proxytest.Service("ns", "web", withPorts(
				v1.ServicePort{Name: "http", Port: 80},
				v1.ServicePort{Name: "bad", Port: 0},
			)),
			want:       []*ServicePort{testPort("ns", "web")},
			wantErrors: []string{"Service ns/web spec.ports[1].port"},
		},
		{
			name: "port above 65535 drops only that port",
			svc: proxytest.Service("ns", "web", withPorts(
				v1.ServicePort{Name: "bad", Port: 70000},
				v1.ServicePort{Name: "http", Port: 80},
			)),
			want:       []*ServicePort{testPort("ns", "web")},
			wantErrors: []string{"Service ns/web spec.ports[0].port"},
		},
		{
			name: "unknown protocol drops only that port",
			svc: proxytest.Service("ns", "web", withPorts(
				v1.ServicePort{Name: "http", Port: 80},
				v1.ServicePort{Name: "icmp", Port: 1, Protocol: "ICMP"},
			)),
			want:       []*ServicePort{testPort("ns", "web")},
			wantErrors: []string{"Service ns/web spec.ports[1].protocol"},
		},
		{
			name: "empty protocol defaults to TCP",
			svc:  proxytest.Service("ns", "web", withPorts(v1.ServicePort{Name: "http", Port: 80})),
			want: []*ServicePort{testPort("ns", "web")},
		},
		{
			name: "duplicate port name drops the second",
			svc: proxytest.Service("ns", "web", withPorts(
				v1.ServicePort{Name: "http", Port: 80},
				v1.ServicePort{Name: "http", Port: 8080},
			)),
			want:       []*ServicePort{testPort("ns", "web")},
			wantErrors: []string{"Service ns/web spec.ports[1].name"},
		},
		{
			name: "NodePort service carries its node port",
			svc:  proxytest.Service("ns", "web", nodePortSvc),
			want: []*ServicePort{testPort("ns", "web", func(p *ServicePort) { p.Type, p.NodePort = v1.ServiceTypeNodePort, 30080 })},
		},
		{
			name:       "invalid node port costs only the NodePort",
			svc:        proxytest.Service("ns", "web", nodePortSvc, func(s *v1.Service) { s.Spec.Ports[0].NodePort = 70000 }),
			want:       []*ServicePort{testPort("ns", "web", func(p *ServicePort) { p.Type = v1.ServiceTypeNodePort })},
			wantErrors: []string{"Service ns/web spec.ports[0].nodePort"},
		},
		{
			name:       "node port on a ClusterIP service is ignored",
			svc:        proxytest.Service("ns", "web", func(s *v1.Service) { s.Spec.Ports[0].NodePort = 30080 }),
			want:       []*ServicePort{testPort("ns", "web")},
			wantErrors: []string{"Service ns/web spec.ports[0].nodePort"},
		},
		{
			name: "external IPs are kept and an invalid one is skipped",
			svc:  proxytest.Service("ns", "web", func(s *v1.Service) { s.Spec.ExternalIPs = []string{"192.0.2.1", "nope", "2001:db8::1"} }),
			want: []*ServicePort{testPort("ns", "web", func(p *ServicePort) {
				p.ExternalIPs = proxytest.Addrs("192.0.2.1", "2001:db8::1")
			})},
			wantErrors: []string{"Service ns/web spec.externalIPs[1]"},
		},
		{
			name: "load balancer ingress IPs skip hostnames and proxy-mode ingress",
			svc: proxytest.Service("ns", "web", lbSvc, func(s *v1.Service) {
				s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{
					{IP: "203.0.113.1"},
					{Hostname: "lb.example.com"},
					{IP: "203.0.113.2", IPMode: ptr.To(v1.LoadBalancerIPModeProxy)},
					{IP: "203.0.113.3", IPMode: ptr.To(v1.LoadBalancerIPModeVIP)},
					{IP: "203.0.113"},
				}
			}),
			want: []*ServicePort{testPort("ns", "web", func(p *ServicePort) {
				p.Type, p.NodePort = v1.ServiceTypeLoadBalancer, 30080
				p.LoadBalancerIPs = proxytest.Addrs("203.0.113.1", "203.0.113.3")
			})},
			wantErrors: []string{"Service ns/web status.loadBalancer.ingress[4].ip"},
		},
		{
			name: "source ranges are trimmed and masked, an invalid one skipped",
			svc: proxytest.Service("ns", "web", lbSvc, func(s *v1.Service) {
				s.Spec.LoadBalancerSourceRanges = []string{" 192.0.2.7/24 ", "10.0.0.0/40"}
			}),
			want: []*ServicePort{testPort("ns", "web", func(p *ServicePort) {
				p.Type, p.NodePort = v1.ServiceTypeLoadBalancer, 30080
				p.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
			})},
			wantErrors: []string{"Service ns/web spec.loadBalancerSourceRanges[1]"},
		},
		{
			name: "source ranges fall back to the annotation",
			svc: proxytest.Service("ns", "web", lbSvc, func(s *v1.Service) {
				s.Annotations = map[string]string{v1.AnnotationLoadBalancerSourceRangesKey: "192.0.2.0/24, 2001:db8::/32"}
			}),
			want: []*ServicePort{testPort("ns", "web", func(p *ServicePort) {
				p.Type, p.NodePort = v1.ServiceTypeLoadBalancer, 30080
				p.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8::/32")}
			})},
		},
		{
			name: "external traffic policy Local on a load balancer carries the health check node port",
			svc: proxytest.Service("ns", "web", lbSvc, func(s *v1.Service) {
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
				s.Spec.HealthCheckNodePort = 32000
			}),
			want: []*ServicePort{testPort("ns", "web", func(p *ServicePort) {
				p.Type, p.NodePort = v1.ServiceTypeLoadBalancer, 30080
				p.ExternalPolicyLocal, p.HealthCheckNodePort = true, 32000
			})},
		},
		{
			name: "load balancer with policy Local and no health check node port is reported",
			svc: proxytest.Service("ns", "web", lbSvc, func(s *v1.Service) {
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			}),
			want: []*ServicePort{testPort("ns", "web", func(p *ServicePort) {
				p.Type, p.NodePort, p.ExternalPolicyLocal = v1.ServiceTypeLoadBalancer, 30080, true
			})},
			wantErrors: []string{"Service ns/web spec.healthCheckNodePort"},
		},
		{
			name: "external traffic policy Local means nothing on a plain ClusterIP service",
			svc: proxytest.Service("ns", "web", func(s *v1.Service) {
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			}),
			want: []*ServicePort{testPort("ns", "web")},
		},
		{
			name: "internal traffic policy Local",
			svc: proxytest.Service("ns", "web", func(s *v1.Service) {
				s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
			}),
			want: []*ServicePort{testPort("ns", "web", func(p *ServicePort) { p.InternalPolicyLocal = true })},
		},
		{
			name: "client IP affinity defaults to 10800 seconds",
			svc:  proxytest.Service("ns", "web", func(s *v1.Service) { s.Spec.SessionAffinity = v1.ServiceAffinityClientIP }),
			want: []*ServicePort{testPort("ns", "web", func(p *ServicePort) { p.AffinityTimeout = 10800 * time.Second })},
		},
		{
			name: "client IP affinity honours its timeout",
			svc: proxytest.Service("ns", "web", func(s *v1.Service) {
				s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
			}),
			want: []*ServicePort{testPort("ns", "web", func(p *ServicePort) { p.AffinityTimeout = time.Minute })},
		},
		{
			name: "invalid affinity timeout falls back to the default",
			svc: proxytest.Service("ns", "web", func(s *v1.Service) {
				s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](0)}}
			}),
			want:       []*ServicePort{testPort("ns", "web", func(p *ServicePort) { p.AffinityTimeout = 10800 * time.Second })},
			wantErrors: []string{"Service ns/web spec.sessionAffinityConfig.clientIP.timeoutSeconds"},
		},
		{
			name: "traffic distribution is carried",
			svc:  proxytest.Service("ns", "web", func(s *v1.Service) { s.Spec.TrafficDistribution = ptr.To(v1.ServiceTrafficDistributionPreferClose) }),
			want: []*ServicePort{testPort("ns", "web", func(p *ServicePort) { p.TrafficDistribution = "PreferClose" })},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ServicePortsFromService(tt.svc)
			if !PortsEqual(got, tt.want) {
				t.Errorf("ports:\ngot:%s\nwant:%s", fmtPorts(got), fmtPorts(tt.want))
			}
			if fields := errFields(t, unjoin(err)); !slices.Equal(fields, tt.wantErrors) {
				t.Errorf("errors: got %q, want %q (%v)", fields, tt.wantErrors, err)
			}
		})
	}
}

func TestFieldErrorNamesObjectAndField(t *testing.T) {
	_, err := ServicePortsFromService(proxytest.Service("ns", "web", func(s *v1.Service) { s.Spec.Ports[0].Port = 0 }))
	want := "Service ns/web: spec.ports[0].port: port 0 is outside 1..65535"
	if err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
}
