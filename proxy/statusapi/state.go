package statusapi

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/kpproxy/kp/proxy"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// StateFromServices rebuilds a State from a status API report, for clients
// (kp flows, kp top) that attribute conntrack flows the way the proxy
// programmed them. Only what the report carries is filled in; an address
// that does not parse is an error naming the service port and field.
func StateFromServices(r *Services) (*proxy.State, error) {
	st := &proxy.State{
		Generation: r.Generation,
		Services:   map[proxy.ServicePortName]*proxy.ServicePort{},
		Endpoints:  map[proxy.ServicePortName][]proxy.Endpoint{},
		Node:       proxy.Node{Name: r.Node.Name},
	}
	var err error
	if st.Node.IPs, err = parseAddrs("node.ips", r.Node.IPs); err != nil {
		return nil, err
	}
	if st.ServiceCIDRs, err = parsePrefixes("serviceCIDRs", r.ServiceCIDRs); err != nil {
		return nil, err
	}
	if r.Node.Zone != "" {
		st.Node.Labels = map[string]string{v1.LabelTopologyZone: r.Node.Zone}
	}
	for i, p := range r.ServicePorts {
		name := proxy.ServicePortName{
			NamespacedName: types.NamespacedName{Namespace: p.Namespace, Name: p.Name},
			Port:           p.PortName, Protocol: v1.Protocol(p.Protocol),
		}
		sp := &proxy.ServicePort{
			Name: name, Type: v1.ServiceType(p.Type), Port: p.Port, Protocol: name.Protocol, NodePort: p.NodePort,
			ExternalPolicyLocal: p.ExternalTrafficPolicy == "Local",
			InternalPolicyLocal: p.InternalTrafficPolicy == "Local",
			AffinityTimeout:     time.Duration(p.SessionAffinitySeconds) * time.Second,
			HealthCheckNodePort: p.HealthCheckNodePort, TrafficDistribution: p.TrafficDistribution,
		}
		field := func(f string) string { return fmt.Sprintf("servicePorts[%d] (%s).%s", i, name, f) }
		if sp.ClusterIPs, err = parseAddrs(field("clusterIPs"), p.ClusterIPs); err != nil {
			return nil, err
		}
		if sp.ExternalIPs, err = parseAddrs(field("externalIPs"), p.ExternalIPs); err != nil {
			return nil, err
		}
		if sp.LoadBalancerIPs, err = parseAddrs(field("loadBalancerIPs"), p.LoadBalancerIPs); err != nil {
			return nil, err
		}
		if sp.LoadBalancerSourceRanges, err = parsePrefixes(field("loadBalancerSourceRanges"), p.LoadBalancerSourceRanges); err != nil {
			return nil, err
		}
		var eps []proxy.Endpoint
		for j, e := range p.Endpoints {
			ip, perr := netip.ParseAddr(e.IP)
			if perr != nil {
				return nil, fmt.Errorf("%s: %w", field(fmt.Sprintf("endpoints[%d].ip", j)), perr)
			}
			ep := proxy.Endpoint{IP: ip.Unmap(), Port: e.Port, Ready: e.Ready, Serving: e.Serving,
				Terminating: e.Terminating}.At(e.NodeName, e.Zone)
			if e.Hints != nil && (len(e.Hints.ForZones) > 0 || len(e.Hints.ForNodes) > 0) {
				ep.Hints = &proxy.EndpointHints{ForZones: e.Hints.ForZones, ForNodes: e.Hints.ForNodes}
			}
			eps = append(eps, ep)
		}
		st.Services[name] = sp
		st.Endpoints[name] = eps
	}
	return st, nil
}

func parseAddrs(field string, ss []string) ([]netip.Addr, error) {
	var out []netip.Addr
	for i, s := range ss {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %w", field, i, err)
		}
		out = append(out, a.Unmap())
	}
	return out, nil
}

func parsePrefixes(field string, ss []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for i, s := range ss {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %w", field, i, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
