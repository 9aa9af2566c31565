package proxy

import (
	"fmt"
	"net/netip"
	"time"
	"unique"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// ServicePortName identifies one port of one Service, as upstream kube-proxy
// names it: namespace/name plus the port's name and protocol.
type ServicePortName struct {
	types.NamespacedName
	Port     string
	Protocol v1.Protocol
}

// String renders the name the way kube-proxy logs it: "ns/name:port" (the
// port part is omitted for a single unnamed port).
func (n ServicePortName) String() string {
	if n.Port == "" {
		return n.NamespacedName.String()
	}
	return fmt.Sprintf("%s:%s", n.NamespacedName.String(), n.Port)
}

// ServicePort is one port of one Service, with every virtual address it is
// reachable at. Addresses of both families are kept together; backends pick
// the family they program (see Addrs helpers).
type ServicePort struct {
	Name       ServicePortName
	Type       v1.ServiceType
	ClusterIPs []netip.Addr
	Port       int32
	Protocol   v1.Protocol
	NodePort   int32

	ExternalIPs              []netip.Addr
	LoadBalancerIPs          []netip.Addr
	LoadBalancerSourceRanges []netip.Prefix

	// ExternalPolicyLocal is externalTrafficPolicy: Local (only meaningful
	// for Services with external addresses or NodePorts).
	ExternalPolicyLocal bool
	// InternalPolicyLocal is internalTrafficPolicy: Local.
	InternalPolicyLocal bool
	HealthCheckNodePort int32

	// AffinityTimeout is the ClientIP session affinity timeout; zero means
	// sessionAffinity: None.
	AffinityTimeout time.Duration

	// TrafficDistribution is spec.trafficDistribution ("" or "PreferClose").
	TrafficDistribution string
}

// HasExternal reports whether the port is reachable from outside the cluster
// network (NodePort, externalIPs, LoadBalancer ingress).
func (sp *ServicePort) HasExternal() bool {
	return sp.NodePort != 0 || len(sp.ExternalIPs) > 0 || len(sp.LoadBalancerIPs) > 0
}

// Endpoint is one backend of a ServicePort: an address and the target port
// resolved for that ServicePort's name, with EndpointSlice conditions.
type Endpoint struct {
	IP   netip.Addr
	Port int32

	Ready       bool
	Serving     bool
	Terminating bool

	// place is the endpoint's nodeName and zone (NodeName, Zone, At).
	place unique.Handle[Place]
	// Hints are the EndpointSlice's hints: where the EndpointSlice
	// controller wants the endpoint used (topology-aware routing,
	// trafficDistribution). nil when there are none, as for almost every
	// endpoint: a pointer keeps an Endpoint small (two slices took it to
	// 112 bytes), and kp keeps one per endpoint and Service port.
	Hints *EndpointHints
}

// Place is where an endpoint runs: its nodeName and zone, "" when unset. An
// Endpoint holds it interned, as one pointer: a cluster has few nodes and
// zones, and with the two strings in every Endpoint it was 72 bytes, not 48
// (7 MB of kp's heap at 30,000 Services of 10 endpoints).
type Place struct {
	NodeName string
	Zone     string
}

// At returns e placed on node, in zone.
func (e Endpoint) At(node, zone string) Endpoint {
	e.place = unique.Handle[Place]{}
	if node != "" || zone != "" {
		e.place = unique.Make(Place{node, zone})
	}
	return e
}

// Place is the endpoint's node and zone.
func (e Endpoint) Place() Place {
	if e.place == (unique.Handle[Place]{}) {
		return Place{}
	}
	return e.place.Value()
}

// NodeName is the endpoint's nodeName ("" when unset).
func (e Endpoint) NodeName() string { return e.Place().NodeName }

// Zone is the endpoint's zone ("" when unset).
func (e Endpoint) Zone() string { return e.Place().Zone }

// EndpointHints are an endpoint's hints.forZones and hints.forNodes. They
// are shared between copies of an Endpoint: never modify them, replace them.
type EndpointHints struct {
	ForZones []string
	ForNodes []string
}

// ZoneHints returns hints.forZones (nil when none).
func (e Endpoint) ZoneHints() []string {
	if e.Hints == nil {
		return nil
	}
	return e.Hints.ForZones
}

// NodeHints returns hints.forNodes (nil when none).
func (e Endpoint) NodeHints() []string {
	if e.Hints == nil {
		return nil
	}
	return e.Hints.ForNodes
}

// AddrPort is the endpoint's address and port.
func (e Endpoint) AddrPort() netip.AddrPort { return netip.AddrPortFrom(e.IP, uint16(e.Port)) }

// String renders the endpoint as "ip:port" ("[ip]:port" for IPv6).
func (e Endpoint) String() string { return e.AddrPort().String() }

// Node is what the proxy knows about the node it runs on.
type Node struct {
	Name   string
	IPs    []netip.Addr // primary node IPs (InternalIP first), per family
	Labels map[string]string
	// ProxyMode is the node's kpproxy.io/proxy-mode annotation: the mode
	// an operator (or kp migrate) asked kp to run on this node, "" when
	// none. It is not a Service input: a change to it alone is no
	// NodeChanged.
	ProxyMode string
	// PodCIDRs are the node's spec.podCIDRs (detectLocalMode NodeCIDR
	// reads them at start; kp proxy exits when they change, as upstream).
	// Not a Service input either.
	PodCIDRs []netip.Prefix
}

// Zone is the node's topology.kubernetes.io/zone label.
func (n Node) Zone() string { return n.Labels[v1.LabelTopologyZone] }
