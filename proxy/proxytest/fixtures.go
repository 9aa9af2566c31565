// Package proxytest holds the Kubernetes objects the proxy packages' tests
// build their inputs from: a valid Service, an EndpointSlice, a
// ServiceCIDR, each changed by the test's mutators.
package proxytest

import (
	"net/netip"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// Service is a valid single-port ClusterIP Service, changed by muts.
func Service(ns, name string, muts ...func(*v1.Service)) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  "10.96.0.10",
			ClusterIPs: []string{"10.96.0.10"},
			Ports:      []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}},
		},
	}
	for _, m := range muts {
		m(s)
	}
	return s
}

// Slice is an IPv4 slice of Service ns/svc with one TCP port "http"
// (8080) and a ready endpoint per address.
func Slice(ns, name, svc string, ips []string, muts ...func(*discovery.EndpointSlice)) *discovery.EndpointSlice {
	s := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: name,
			Labels: map[string]string{discovery.LabelServiceName: svc},
		},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
	for _, ip := range ips {
		s.Endpoints = append(s.Endpoints, discovery.Endpoint{Addresses: []string{ip}})
	}
	for _, m := range muts {
		m(s)
	}
	return s
}

// ServiceCIDR is a networking.k8s.io/v1 ServiceCIDR named name.
func ServiceCIDR(name string, cidrs ...string) *networkingv1.ServiceCIDR {
	return &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: cidrs}}
}

// Addrs parses addresses.
func Addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// Sink is the part of a proxy.Sink the Add helpers call.
type Sink interface {
	OnService(namespace, name string, svc *v1.Service)
	OnEndpointSlice(namespace, name string, slice *discovery.EndpointSlice)
}

// AddService reports svc to s.
func AddService(s Sink, svc *v1.Service) { s.OnService(svc.Namespace, svc.Name, svc) }

// AddSlice reports sl to s.
func AddSlice(s Sink, sl *discovery.EndpointSlice) { s.OnEndpointSlice(sl.Namespace, sl.Name, sl) }
