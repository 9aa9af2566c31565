package server

import (
	"fmt"
	"net/netip"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// servicePortReport turns one service port and its endpoints into the
// status API's form. counted says the backend counts connections: every
// usable endpoint then gets counters (zero when the kernel has none yet).
func servicePortReport(sp *proxy.ServicePort, eps []proxy.Endpoint, node proxy.Node, counters map[proxy.EndpointRef]proxy.EndpointCounter, counted bool) statusapi.ServicePort {
	r := statusapi.ServicePort{
		Namespace:              sp.Name.Namespace,
		Name:                   sp.Name.Name,
		PortName:               sp.Name.Port,
		Protocol:               string(sp.Protocol),
		Type:                   string(sp.Type),
		ClusterIPs:             addrStrings(sp.ClusterIPs),
		Port:                   sp.Port,
		NodePort:               sp.NodePort,
		ExternalIPs:            addrStrings(sp.ExternalIPs),
		LoadBalancerIPs:        addrStrings(sp.LoadBalancerIPs),
		ExternalTrafficPolicy:  policyName(sp.ExternalPolicyLocal),
		InternalTrafficPolicy:  policyName(sp.InternalPolicyLocal),
		SessionAffinitySeconds: int64(sp.AffinityTimeout / time.Second),
		Endpoints:              []statusapi.Endpoint{},
	}
	usable := proxy.Selected(sp, eps, node)
	for _, e := range eps {
		re := statusapi.Endpoint{
			IP: e.IP.String(), Port: e.Port,
			Ready: e.Ready, Serving: e.Serving, Terminating: e.Terminating,
			NodeName: e.NodeName(), Zone: e.Zone(),
			Usable: usable[e.AddrPort()],
		}
		if c, ok := counters[proxy.EndpointRef{ServicePort: sp.Name, Endpoint: e.AddrPort()}]; ok {
			re.Counters = &statusapi.Counters{NewConnections: c.Packets, Bytes: c.Bytes, ActiveConnections: c.Active}
		} else if counted && re.Usable && counters != nil {
			re.Counters = &statusapi.Counters{}
		}
		r.Endpoints = append(r.Endpoints, re)
	}
	return r
}

func policyName(local bool) string {
	if local {
		return "Local"
	}
	return "Cluster"
}

func addrStrings(addrs []netip.Addr) []string {
	if len(addrs) == 0 {
		return nil
	}
	out := make([]string, len(addrs))
	for i, a := range addrs {
		out[i] = a.String()
	}
	return out
}

// StateFromServices rebuilds a State from a status API report, for clients
// (kp flows, kp top) that attribute conntrack flows the way the proxy
// programmed them. Only what the report carries is filled in; an address
// that does not parse is an error naming the service port and field.
func StateFromServices(r *statusapi.Services) (*proxy.State, error) {
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
		var eps []proxy.Endpoint
		for j, e := range p.Endpoints {
			ip, perr := netip.ParseAddr(e.IP)
			if perr != nil {
				return nil, fmt.Errorf("%s: %w", field(fmt.Sprintf("endpoints[%d].ip", j)), perr)
			}
			eps = append(eps, proxy.Endpoint{IP: ip, Port: e.Port, Ready: e.Ready, Serving: e.Serving,
				Terminating: e.Terminating}.At(e.NodeName, e.Zone))
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
		out = append(out, a)
	}
	return out, nil
}
