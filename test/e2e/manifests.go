// Package e2e holds kp's end-to-end tests: kp proxy runs as a real process in
// a node network namespace built by test/netns, reads Services and
// EndpointSlices from a folder of manifests (--manifests), and real TCP and
// UDP packets from pods and an off-node client go through what it programs.
//
// This file turns small structs into the API's own manifests.
package e2e

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// Service describes a Service and its endpoints; Objects turns it into a
// v1 Service and one EndpointSlice per IP family (more if endpoints carry
// their own port numbers).
type Service struct {
	Namespace  string         // default "e2e"
	Name       string         //
	Type       v1.ServiceType // default ClusterIP
	ClusterIPs []string       // first is .spec.clusterIP; families follow the addresses
	Ports      []Port
	Endpoints  []Endpoint
	// NoSlices writes the Service without any EndpointSlice (a Service
	// whose endpoints the controller never published); otherwise an empty
	// Endpoints list writes empty slices.
	NoSlices bool
	// ExternalTrafficPolicy and InternalTrafficPolicy: "" keeps the API default (Cluster).
	ExternalTrafficPolicy v1.ServiceExternalTrafficPolicy
	InternalTrafficPolicy v1.ServiceInternalTrafficPolicy
	// AffinitySeconds > 0 sets sessionAffinity ClientIP with that timeout.
	AffinitySeconds     int32
	ExternalIPs         []string
	LoadBalancerIPs     []string // status.loadBalancer.ingress (type LoadBalancer)
	SourceRanges        []string // spec.loadBalancerSourceRanges
	TrafficDistribution string
}

// Port is one Service port. TargetPort (a number) or TargetPortName (a
// container port's name) says where endpoints listen; the EndpointSlice port
// number is TargetPort unless an endpoint sets its own in Endpoint.Ports.
type Port struct {
	Name           string
	Protocol       v1.Protocol // default TCP
	Port           int32
	TargetPort     int32
	TargetPortName string
	NodePort       int32
}

// Endpoint is one address in the Service's EndpointSlices. Ready, Serving and
// Terminating left nil are ready, serving and not terminating; set them to
// describe anything else.
type Endpoint struct {
	IP          string
	Ready       *bool
	Serving     *bool
	Terminating *bool
	NodeName    string
	Zone        string
	ZoneHints   []string
	NodeHints   []string // hints.forNodes (PreferSameNode's hints)
	// Ports overrides the slice port number per Service port name, as named
	// targetPorts do when pods number their ports differently.
	Ports map[string]int32
}

// Bool returns a pointer to b, for Endpoint's conditions.
func Bool(b bool) *bool { return &b }

// NotReady is an endpoint that is neither ready nor serving.
func NotReady(ip string) Endpoint { return Endpoint{IP: ip, Ready: Bool(false), Serving: Bool(false)} }

// Terminating is an endpoint that is shutting down but still serving.
func Terminating(ip string) Endpoint {
	return Endpoint{IP: ip, Ready: Bool(false), Serving: Bool(true), Terminating: Bool(true)}
}

func (s Service) namespace() string {
	if s.Namespace == "" {
		return "e2e"
	}
	return s.Namespace
}

// Objects returns the Service followed by its EndpointSlices.
func (s Service) Objects() []any {
	svc := &v1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Namespace: s.namespace(), Name: s.Name},
		Spec: v1.ServiceSpec{
			Type:                  s.Type,
			ClusterIPs:            s.ClusterIPs,
			ExternalTrafficPolicy: s.ExternalTrafficPolicy,
		},
	}
	if svc.Spec.Type == "" {
		svc.Spec.Type = v1.ServiceTypeClusterIP
	}
	if s.InternalTrafficPolicy != "" {
		p := s.InternalTrafficPolicy
		svc.Spec.InternalTrafficPolicy = &p
	}
	if s.AffinitySeconds > 0 {
		svc.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		svc.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: &s.AffinitySeconds}}
	}
	svc.Spec.ExternalIPs = s.ExternalIPs
	svc.Spec.LoadBalancerSourceRanges = s.SourceRanges
	for _, ip := range s.LoadBalancerIPs {
		svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: ip})
	}
	if s.TrafficDistribution != "" {
		td := s.TrafficDistribution
		svc.Spec.TrafficDistribution = &td
	}
	if len(s.ClusterIPs) > 0 {
		svc.Spec.ClusterIP = s.ClusterIPs[0]
		for _, ip := range s.ClusterIPs {
			svc.Spec.IPFamilies = append(svc.Spec.IPFamilies, family(ip))
		}
		policy := v1.IPFamilyPolicySingleStack
		if len(s.ClusterIPs) > 1 {
			policy = v1.IPFamilyPolicyRequireDualStack
		}
		svc.Spec.IPFamilyPolicy = &policy
	}
	for _, p := range s.Ports {
		sp := v1.ServicePort{Name: p.Name, Protocol: protocol(p), Port: p.Port, NodePort: p.NodePort,
			TargetPort: intstr.FromInt32(p.TargetPort)}
		if p.TargetPortName != "" {
			sp.TargetPort = intstr.FromString(p.TargetPortName)
		}
		svc.Spec.Ports = append(svc.Spec.Ports, sp)
	}
	objs := []any{svc}
	if s.NoSlices {
		return objs
	}

	// One slice per address family and port numbering, as the controller
	// would publish them. Families named by the Service get a slice even
	// when empty, so "no endpoints" is stated rather than left unknown.
	type group struct {
		family discovery.AddressType
		ports  string
	}
	slices_ := map[group]*discovery.EndpointSlice{}
	var order []group
	sliceFor := func(g group, ports map[string]int32) *discovery.EndpointSlice {
		if sl, ok := slices_[g]; ok {
			return sl
		}
		sl := &discovery.EndpointSlice{
			TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
			ObjectMeta: metav1.ObjectMeta{
				Namespace: s.namespace(),
				Name:      fmt.Sprintf("%s-%s-%d", s.Name, strings.ToLower(string(g.family)), len(order)),
				Labels: map[string]string{
					discovery.LabelServiceName: s.Name,
					discovery.LabelManagedBy:   "e2e.kp.test",
				},
			},
			AddressType: g.family,
			Endpoints:   []discovery.Endpoint{},
		}
		for _, p := range s.Ports {
			name, proto := p.Name, protocol(p)
			port := p.TargetPort
			if n, ok := ports[p.Name]; ok {
				port = n
			}
			sl.Ports = append(sl.Ports, discovery.EndpointPort{Name: &name, Protocol: &proto, Port: &port})
		}
		slices_[g] = sl
		order = append(order, g)
		return sl
	}
	for _, ip := range s.ClusterIPs {
		sliceFor(group{family: addressType(ip)}, nil)
	}
	for _, e := range s.Endpoints {
		g := group{family: addressType(e.IP), ports: portKey(e.Ports)}
		sl := sliceFor(g, e.Ports)
		ep := discovery.Endpoint{
			Addresses: []string{e.IP},
			Conditions: discovery.EndpointConditions{
				Ready:       e.Ready,
				Serving:     e.Serving,
				Terminating: e.Terminating,
			},
		}
		if ep.Conditions.Ready == nil {
			ep.Conditions.Ready = Bool(true)
		}
		if e.NodeName != "" {
			n := e.NodeName
			ep.NodeName = &n
		}
		if e.Zone != "" {
			z := e.Zone
			ep.Zone = &z
		}
		if len(e.ZoneHints)+len(e.NodeHints) > 0 {
			ep.Hints = &discovery.EndpointHints{}
			for _, z := range e.ZoneHints {
				ep.Hints.ForZones = append(ep.Hints.ForZones, discovery.ForZone{Name: z})
			}
			for _, n := range e.NodeHints {
				ep.Hints.ForNodes = append(ep.Hints.ForNodes, discovery.ForNode{Name: n})
			}
		}
		sl.Endpoints = append(sl.Endpoints, ep)
	}
	for _, g := range order {
		objs = append(objs, slices_[g])
	}
	return objs
}

func protocol(p Port) v1.Protocol {
	if p.Protocol == "" {
		return v1.ProtocolTCP
	}
	return p.Protocol
}

func family(ip string) v1.IPFamily {
	if a, err := netip.ParseAddr(ip); err == nil && a.Is6() {
		return v1.IPv6Protocol
	}
	return v1.IPv4Protocol
}

func addressType(ip string) discovery.AddressType {
	if family(ip) == v1.IPv6Protocol {
		return discovery.AddressTypeIPv6
	}
	return discovery.AddressTypeIPv4
}

func portKey(ports map[string]int32) string {
	keys := make([]string, 0, len(ports))
	for k, v := range ports {
		keys = append(keys, fmt.Sprintf("%s=%d", k, v))
	}
	slices.Sort(keys)
	return strings.Join(keys, ",")
}

// Node is the proxy's own Node object: its name (kp's --hostname-override),
// InternalIP addresses (the primary ones answer NodePorts) and pod CIDRs.
func Node(name string, internalIPs []string, podCIDRs []string) *v1.Node {
	n := &v1.Node{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1.NodeSpec{PodCIDRs: podCIDRs},
	}
	if len(podCIDRs) > 0 {
		n.Spec.PodCIDR = podCIDRs[0]
	}
	for _, ip := range internalIPs {
		n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: ip})
	}
	n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeHostName, Address: name})
	return n
}

// YAML renders objects as one multi-document YAML manifest. Service values
// are expanded into their objects.
func YAML(objs ...any) ([]byte, error) {
	var b bytes.Buffer
	for _, o := range objs {
		if s, ok := o.(Service); ok {
			more, err := YAML(s.Objects()...)
			if err != nil {
				return nil, err
			}
			b.Write(more)
			continue
		}
		y, err := yaml.Marshal(o)
		if err != nil {
			return nil, fmt.Errorf("render %T: %w", o, err)
		}
		b.WriteString("---\n")
		b.Write(y)
	}
	return b.Bytes(), nil
}

// ManifestDir is the folder kp reads with --manifests.
type ManifestDir string

// Write renders objects (Services, Nodes, any API object) into file,
// replacing it atomically: kp never sees half a file.
func (d ManifestDir) Write(file string, objs ...any) error {
	y, err := YAML(objs...)
	if err != nil {
		return fmt.Errorf("write %s: %w", file, err)
	}
	return d.WriteRaw(file, y)
}

// WriteRaw replaces file with content, atomically (a rename from a hidden
// temporary file whose name kp ignores).
func (d ManifestDir) WriteRaw(file string, content []byte) error {
	tmp := filepath.Join(string(d), "."+file+".tmp")
	if err := os.WriteFile(tmp, content, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(string(d), file))
}

// Remove deletes file.
func (d ManifestDir) Remove(file string) error {
	return os.Remove(filepath.Join(string(d), file))
}
