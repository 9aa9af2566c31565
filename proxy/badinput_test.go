package proxy

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/kpproxy/kp/proxy/proxytest"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
)

// TestBadInputIsLoggedAndSkippedAlone feeds the tracker one bad object at a
// time next to a good Service (ns/good, 10.96.0.99:80 → 10.0.0.99:8080) and
// checks the promise: the bad object is logged with its kind, name
// and the field at fault; what is bad is skipped; everything else works.
func TestBadInputIsLoggedAndSkippedAlone(t *testing.T) {
	good := proxytest.Service("ns", "good", func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.99", nil })
	goodSlice := proxytest.Slice("ns", "good-1", "good", []string{"10.0.0.99"})
	web := spName("ns", "web", "http", v1.ProtocolTCP)

	tests := []struct {
		name    string
		objects func(s Sink)
		// wantLog: kind, object and field of each logged error.
		wantLog [][3]string
		// wantWeb: web's endpoints after the sync ("-" when web has no
		// usable port at all).
		wantWeb string
	}{
		{
			name: "invalid cluster IP string",
			objects: func(s Sink) {
				proxytest.AddService(s, proxytest.Service("ns", "web", func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.300", nil }))
			},
			wantLog: [][3]string{{"Service", "ns/web", "spec.clusterIP"}},
			wantWeb: "-",
		},
		{
			name: "invalid external IP and endpoint address strings drop only those",
			objects: func(s Sink) {
				proxytest.AddService(s, proxytest.Service("ns", "web", func(s *v1.Service) { s.Spec.ExternalIPs = []string{"1.2.3.4", "not-an-ip"} }))
				proxytest.AddSlice(s, proxytest.Slice("ns", "web-1", "web", []string{"10.0.0.1", "10.0.0.x", "10.0.0.2"}))
			},
			wantLog: [][3]string{
				{"Service", "ns/web", "spec.externalIPs[1]"},
				{"EndpointSlice", "ns/web-1", "endpoints[1].addresses[0]"},
			},
			wantWeb: "10.0.0.1:8080 10.0.0.2:8080",
		},
		{
			name: "port 0",
			objects: func(s Sink) {
				proxytest.AddService(s, proxytest.Service("ns", "web", func(s *v1.Service) { s.Spec.Ports[0].Port = 0 }))
			},
			wantLog: [][3]string{{"Service", "ns/web", "spec.ports[0].port"}},
			wantWeb: "-",
		},
		{
			name: "port 70000 in the Service and in the slice",
			objects: func(s Sink) {
				proxytest.AddService(s, proxytest.Service("ns", "web", func(s *v1.Service) {
					s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "big", Port: 70000, Protocol: v1.ProtocolTCP})
				}))
				proxytest.AddSlice(s, proxytest.Slice("ns", "web-1", "web", []string{"10.0.0.1"}, func(sl *discovery.EndpointSlice) {
					sl.Ports = append(sl.Ports, discovery.EndpointPort{Name: ptr.To("big"), Port: ptr.To[int32](70000)})
				}))
			},
			wantLog: [][3]string{
				{"Service", "ns/web", "spec.ports[1].port"},
				{"EndpointSlice", "ns/web-1", "ports[1].port"},
			},
			wantWeb: "10.0.0.1:8080",
		},
		{
			name: "nodePort 70000 costs only the NodePort",
			objects: func(s Sink) {
				proxytest.AddService(s, proxytest.Service("ns", "web", func(s *v1.Service) {
					s.Spec.Type = v1.ServiceTypeNodePort
					s.Spec.Ports[0].NodePort = 70000
				}))
				proxytest.AddSlice(s, proxytest.Slice("ns", "web-1", "web", []string{"10.0.0.1"}))
			},
			wantLog: [][3]string{{"Service", "ns/web", "spec.ports[0].nodePort"}},
			wantWeb: "10.0.0.1:8080",
		},
		{
			name: "unknown protocol",
			objects: func(s Sink) {
				proxytest.AddService(s, proxytest.Service("ns", "web", func(s *v1.Service) { s.Spec.Ports[0].Protocol = "QUIC" }))
				proxytest.AddSlice(s, proxytest.Slice("ns", "web-1", "web", []string{"10.0.0.1"}, func(sl *discovery.EndpointSlice) {
					sl.Ports[0].Protocol = ptr.To(v1.Protocol("ICMP"))
				}))
			},
			wantLog: [][3]string{
				{"Service", "ns/web", "spec.ports[0].protocol"},
				{"EndpointSlice", "ns/web-1", "ports[0].protocol"},
			},
			wantWeb: "-",
		},
		{
			name: "EndpointSlice of the wrong address family",
			objects: func(s Sink) {
				proxytest.AddService(s, proxytest.Service("ns", "web"))
				proxytest.AddSlice(s, proxytest.Slice("ns", "web-1", "web", []string{"fd00::1", "10.0.0.1"}))
				proxytest.AddSlice(s, proxytest.Slice("ns", "web-2", "web", []string{"10.0.0.2"}, func(sl *discovery.EndpointSlice) {
					sl.AddressType = "IPv5"
				}))
			},
			wantLog: [][3]string{
				{"EndpointSlice", "ns/web-1", "endpoints[0].addresses[0]"},
				{"EndpointSlice", "ns/web-2", "addressType"},
			},
			wantWeb: "10.0.0.1:8080",
		},
		{
			name: "the same endpoint in two slices counts once, ready copy wins",
			objects: func(s Sink) {
				proxytest.AddService(s, proxytest.Service("ns", "web"))
				proxytest.AddSlice(s, proxytest.Slice("ns", "web-1", "web", []string{"10.0.0.1"}, func(sl *discovery.EndpointSlice) {
					sl.Endpoints[0].Conditions.Ready = ptr.To(false)
				}))
				proxytest.AddSlice(s, proxytest.Slice("ns", "web-2", "web", []string{"10.0.0.1", "10.0.0.2"}))
			},
			wantWeb: "10.0.0.1:8080 10.0.0.2:8080",
		},
		{
			name: "a slice without the service-name label is someone else's: ignored, not logged",
			objects: func(s Sink) {
				proxytest.AddService(s, proxytest.Service("ns", "web"))
				proxytest.AddSlice(s, proxytest.Slice("ns", "web-1", "web", []string{"10.0.0.1"}))
				proxytest.AddSlice(s, proxytest.Slice("ns", "mirrored-1", "", []string{"10.0.0.7"}, func(sl *discovery.EndpointSlice) {
					delete(sl.Labels, discovery.LabelServiceName)
					sl.Labels[discovery.LabelManagedBy] = "endpointslicemirroring-controller.k8s.io"
				}))
			},
			wantWeb: "10.0.0.1:8080",
		},
		{
			name: "Service and port names the API would refuse (they name kernel objects)",
			objects: func(s Sink) {
				proxytest.AddService(s, proxytest.Service("ns", "web", func(s *v1.Service) {
					s.Spec.Ports = append(s.Spec.Ports,
						v1.ServicePort{Name: "Web/80", Port: 8080, Protocol: v1.ProtocolTCP},
						v1.ServicePort{Name: "p" + strings.Repeat("x", 63), Port: 8081, Protocol: v1.ProtocolTCP})
				}))
				proxytest.AddService(s, proxytest.Service("ns", strings.Repeat("x", 64)))
				proxytest.AddService(s, proxytest.Service("Bad/NS", "web"))
				proxytest.AddSlice(s, proxytest.Slice("ns", "web-1", "web", []string{"10.0.0.1"}))
			},
			wantLog: [][3]string{
				{"Service", "ns/web", "spec.ports[1].name"},
				{"Service", "ns/web", "spec.ports[2].name"},
				{"Service", "ns/" + strings.Repeat("x", 64), "metadata.name"},
				{"Service", "Bad/NS/web", "metadata.namespace"},
			},
			wantWeb: "10.0.0.1:8080",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			tr, _ := newTestTracker(t, slog.New(slog.NewTextHandler(&logs, nil)))
			proxytest.AddService(tr, good)
			proxytest.AddSlice(tr, goodSlice)
			tt.objects(tr)
			st := tr.Snapshot()

			if got := endpointList(st, spName("ns", "good", "http", v1.ProtocolTCP)); got != "10.0.0.99:8080" {
				t.Errorf("the good Service's endpoints = %q, want 10.0.0.99:8080", got)
			}
			if got := endpointList(st, web); got != tt.wantWeb {
				t.Errorf("web's endpoints = %q, want %q", got, tt.wantWeb)
			}
			out := logs.String()
			for _, w := range tt.wantLog {
				line := fmt.Sprintf("kind=%s object=%s field=%s ", w[0], quoteIfNeeded(w[1]), w[2])
				if !strings.Contains(out, line) {
					t.Errorf("log lacks %q:\n%s", line, out)
				}
			}
			if n := strings.Count(out, "invalid field skipped"); n != len(tt.wantLog) {
				t.Errorf("%d errors logged, want %d:\n%s", n, len(tt.wantLog), out)
			}
		})
	}
}

func TestServiceOf5000EndpointsIsKeptWhole(t *testing.T) {
	tr, _ := newTestTracker(t, nil)
	proxytest.AddService(tr, proxytest.Service("ns", "web"))
	// 5,000 endpoints in 50 slices of 100, as the controller splits them.
	for s := 0; s < 50; s++ {
		var ips []string
		for i := 0; i < 100; i++ {
			n := s*100 + i
			ips = append(ips, fmt.Sprintf("10.%d.%d.%d", n/65536, (n/256)%256, n%256))
		}
		proxytest.AddSlice(tr, proxytest.Slice("ns", fmt.Sprintf("web-%02d", s), "web", ips))
	}
	st := tr.Snapshot()
	eps := st.Endpoints[spName("ns", "web", "http", v1.ProtocolTCP)]
	if len(eps) != 5000 {
		t.Fatalf("%d endpoints, want 5000", len(eps))
	}
	for i := 1; i < len(eps); i++ {
		if eps[i-1].IP.Compare(eps[i].IP) >= 0 {
			t.Fatalf("endpoints not sorted and unique at %d: %s, %s", i, eps[i-1], eps[i])
		}
	}
}

func endpointList(st *State, name ServicePortName) string {
	if _, ok := st.Services[name]; !ok {
		return "-"
	}
	var parts []string
	for _, e := range st.Endpoints[name] {
		parts = append(parts, e.String())
	}
	return strings.Join(parts, " ")
}

// quoteIfNeeded mirrors slog's text handler, which quotes values with
// characters outside a plain word.
func quoteIfNeeded(s string) string {
	if strings.ContainsAny(s, " =\"") {
		return fmt.Sprintf("%q", s)
	}
	return s
}
