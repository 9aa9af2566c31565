package proxy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/kpproxy/kp/proxy/proxytest"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
)

// ep is a ready, serving endpoint.
func ep(ipPort string, muts ...func(*Endpoint)) Endpoint {
	ap := netip.MustParseAddrPort(ipPort)
	e := Endpoint{IP: ap.Addr(), Port: int32(ap.Port()), Ready: true, Serving: true}
	for _, m := range muts {
		m(&e)
	}
	return e
}

func fmtEndpoints(eps []Endpoint) string {
	var b strings.Builder
	for _, e := range eps {
		fmt.Fprintf(&b, "\n  %s %+v", e, e)
	}
	return b.String()
}

func TestEndpointsFor(t *testing.T) {
	web := spName("ns", "web", "http", v1.ProtocolTCP)
	notReady := func(e *Endpoint) { e.Ready, e.Serving = false, false }
	tests := []struct {
		name       string
		sp         ServicePortName
		slices     []*discovery.EndpointSlice
		want       []Endpoint
		wantErrors []string
	}{
		{
			name: "endpoints of every slice of the service, sorted by IP then port",
			sp:   web,
			slices: []*discovery.EndpointSlice{
				proxytest.Slice("ns", "web-b", "web", []string{"10.0.0.3", "10.0.0.1"}),
				proxytest.Slice("ns", "web-a", "web", []string{"10.0.0.2"}, func(s *discovery.EndpointSlice) {
					s.Ports[0].Port = ptr.To[int32](9090)
				}),
				proxytest.Slice("ns", "web-c", "web", []string{"10.0.0.2"}),
			},
			want: []Endpoint{ep("10.0.0.1:8080"), ep("10.0.0.2:8080"), ep("10.0.0.2:9090"), ep("10.0.0.3:8080")},
		},
		{
			name: "slices of other services and other namespaces are left out",
			sp:   web,
			slices: []*discovery.EndpointSlice{
				proxytest.Slice("ns", "web-a", "web", []string{"10.0.0.1"}),
				proxytest.Slice("ns", "api-a", "api", []string{"10.0.0.2"}),
				proxytest.Slice("other", "web-a", "web", []string{"10.0.0.3"}),
			},
			want: []Endpoint{ep("10.0.0.1:8080")},
		},
		{
			name: "the target port is the slice port with the same name and protocol",
			sp:   spName("ns", "web", "dns", v1.ProtocolUDP),
			slices: []*discovery.EndpointSlice{
				proxytest.Slice("ns", "web-a", "web", []string{"10.0.0.1"}, func(s *discovery.EndpointSlice) {
					s.Ports = []discovery.EndpointPort{
						{Name: ptr.To("dns"), Port: ptr.To[int32](5353), Protocol: ptr.To(v1.ProtocolTCP)},
						{Name: ptr.To("dns"), Port: ptr.To[int32](5354), Protocol: ptr.To(v1.ProtocolUDP)},
					}
				}),
				proxytest.Slice("ns", "web-b", "web", []string{"10.0.0.2"}), // no "dns" port
			},
			want: []Endpoint{ep("10.0.0.1:5354")},
		},
		{
			name: "unnamed port with no protocol matches an unnamed TCP service port",
			sp:   spName("ns", "web", "", v1.ProtocolTCP),
			slices: []*discovery.EndpointSlice{
				proxytest.Slice("ns", "web-a", "web", []string{"10.0.0.1"}, func(s *discovery.EndpointSlice) {
					s.Ports = []discovery.EndpointPort{{Port: ptr.To[int32](8080)}}
				}),
			},
			want: []Endpoint{ep("10.0.0.1:8080")},
		},
		{
			name: "conditions: ready defaults to true, serving to ready, terminating to false",
			sp:   web,
			slices: []*discovery.EndpointSlice{
				proxytest.Slice("ns", "web-a", "web", nil, func(s *discovery.EndpointSlice) {
					s.Endpoints = []discovery.Endpoint{
						{Addresses: []string{"10.0.0.1"}},
						{Addresses: []string{"10.0.0.2"}, Conditions: discovery.EndpointConditions{Ready: ptr.To(false)}},
						{Addresses: []string{"10.0.0.3"}, Conditions: discovery.EndpointConditions{
							Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true),
						}},
					}
				}),
			},
			want: []Endpoint{
				ep("10.0.0.1:8080"),
				ep("10.0.0.2:8080", notReady),
				ep("10.0.0.3:8080", func(e *Endpoint) { e.Ready, e.Terminating = false, true }),
			},
		},
		{
			name: "node name, zone and zone hints are carried",
			sp:   web,
			slices: []*discovery.EndpointSlice{
				proxytest.Slice("ns", "web-a", "web", nil, func(s *discovery.EndpointSlice) {
					s.Endpoints = []discovery.Endpoint{{
						Addresses: []string{"10.0.0.1"}, NodeName: ptr.To("node-a"), Zone: ptr.To("zone-a"),
						Hints: &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: "zone-a"}, {Name: "zone-b"}}},
					}}
				}),
			},
			want: []Endpoint{ep("10.0.0.1:8080", func(e *Endpoint) {
				*e = e.At("node-a", "zone-a")
				e.Hints = &EndpointHints{ForZones: []string{"zone-a", "zone-b"}}
			})},
		},
		{
			name: "the same address and port in two slices counts once, the ready copy winning",
			sp:   web,
			slices: []*discovery.EndpointSlice{
				proxytest.Slice("ns", "web-a", "web", nil, func(s *discovery.EndpointSlice) {
					s.Endpoints = []discovery.Endpoint{{Addresses: []string{"10.0.0.1"}, Conditions: discovery.EndpointConditions{Ready: ptr.To(false)}}}
				}),
				proxytest.Slice("ns", "web-b", "web", []string{"10.0.0.1", "10.0.0.1"}),
			},
			want: []Endpoint{ep("10.0.0.1:8080")},
		},
		{
			name: "IPv6 slices give IPv6 endpoints",
			sp:   web,
			slices: []*discovery.EndpointSlice{
				proxytest.Slice("ns", "web-a", "web", []string{"fd00::2", "fd00::1"}, func(s *discovery.EndpointSlice) {
					s.AddressType = discovery.AddressTypeIPv6
				}),
			},
			want: []Endpoint{ep("[fd00::1]:8080"), ep("[fd00::2]:8080")},
		},
		{
			name: "FQDN slices are ignored without error",
			sp:   web,
			slices: []*discovery.EndpointSlice{
				proxytest.Slice("ns", "web-a", "web", []string{"example.com"}, func(s *discovery.EndpointSlice) {
					s.AddressType = discovery.AddressTypeFQDN
				}),
			},
		},
		{
			name: "bad endpoints are skipped and named, the others kept",
			sp:   web,
			slices: []*discovery.EndpointSlice{
				proxytest.Slice("ns", "web-a", "web", []string{"10.0.0.1", "10.0.0.999", "fd00::1", "10.0.0.2"}, func(s *discovery.EndpointSlice) {
					s.Endpoints = append(s.Endpoints, discovery.Endpoint{})
				}),
			},
			want: []Endpoint{ep("10.0.0.1:8080"), ep("10.0.0.2:8080")},
			wantErrors: []string{
				"EndpointSlice ns/web-a endpoints[1].addresses[0]",
				"EndpointSlice ns/web-a endpoints[2].addresses[0]",
				"EndpointSlice ns/web-a endpoints[4].addresses",
			},
		},
		{
			name: "bad slice ports are skipped and named",
			sp:   web,
			slices: []*discovery.EndpointSlice{
				proxytest.Slice("ns", "web-a", "web", []string{"10.0.0.1"}, func(s *discovery.EndpointSlice) {
					s.Ports = []discovery.EndpointPort{
						{Name: ptr.To("http"), Port: ptr.To[int32](0)},
						{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.Protocol("ICMP"))},
						{Name: ptr.To("other"), Port: nil},
						{Name: ptr.To("http"), Port: ptr.To[int32](8081)},
						{Name: ptr.To("http"), Port: ptr.To[int32](8082)},
					}
				}),
			},
			want: []Endpoint{ep("10.0.0.1:8081")},
			wantErrors: []string{
				"EndpointSlice ns/web-a ports[0].port",
				"EndpointSlice ns/web-a ports[1].protocol",
				"EndpointSlice ns/web-a ports[2].port",
				"EndpointSlice ns/web-a ports[4].name",
			},
		},
		{
			name: "unknown address type is named and the slice skipped",
			sp:   web,
			slices: []*discovery.EndpointSlice{
				proxytest.Slice("ns", "web-a", "web", []string{"10.0.0.1"}, func(s *discovery.EndpointSlice) { s.AddressType = "IPX" }),
				proxytest.Slice("ns", "web-b", "web", []string{"10.0.0.2"}),
			},
			want:       []Endpoint{ep("10.0.0.2:8080")},
			wantErrors: []string{"EndpointSlice ns/web-a addressType"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, errs := EndpointsFor(tt.sp, tt.slices)
			if !EndpointsEqual(got, tt.want) {
				t.Errorf("endpoints:\ngot:%s\nwant:%s", fmtEndpoints(got), fmtEndpoints(tt.want))
			}
			if fields := errFields(t, errs); !slices.Equal(fields, tt.wantErrors) {
				t.Errorf("errors: got %q, want %q (%v)", fields, tt.wantErrors, errs)
			}
		})
	}
}

// An Endpoint is kept per endpoint and Service port (300,000 at 30,000
// Services of 10): its node and zone are one interned pointer.
func TestEndpointIs48BytesWithItsPlaceInterned(t *testing.T) {
	if size := unsafe.Sizeof(Endpoint{}); size != 48 {
		t.Errorf("an Endpoint is %d bytes, want 48", size)
	}
	a := Endpoint{IP: netip.MustParseAddr("10.0.0.1")}.At("node-a", "zone-a")
	b := Endpoint{IP: netip.MustParseAddr("10.0.0.1")}.At(strings.Clone("node-a"), strings.Clone("zone-a"))
	if !a.Equal(b) || a != b || a.NodeName() != "node-a" || a.Zone() != "zone-a" {
		t.Errorf("the same place twice: %v %q %q, %v %q %q", a, a.NodeName(), a.Zone(), b, b.NodeName(), b.Zone())
	}
	if c := a.At("", ""); c.NodeName() != "" || c.Zone() != "" || c.Equal(a) || !c.Equal(Endpoint{IP: a.IP}) {
		t.Errorf("no place: %q %q", c.NodeName(), c.Zone())
	}
	if c := a.At("node-b", "zone-a"); c.Equal(a) || c.NodeName() != "node-b" {
		t.Errorf("another node: %q, equal to the first %v", c.NodeName(), c.Equal(a))
	}
}
