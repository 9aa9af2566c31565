package server

import (
	"net/netip"
	"time"

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

		LoadBalancerSourceRanges: prefixStrings(sp.LoadBalancerSourceRanges),
		HealthCheckNodePort:      sp.HealthCheckNodePort,
		TrafficDistribution:      sp.TrafficDistribution,
	}
	usable := proxy.Selected(sp, eps, node)
	for _, e := range eps {
		re := statusapi.Endpoint{
			IP: e.IP.String(), Port: e.Port,
			Ready: e.Ready, Serving: e.Serving, Terminating: e.Terminating,
			NodeName: e.NodeName(), Zone: e.Zone(),
			Usable: usable[e.AddrPort()],
		}
		if e.Hints != nil {
			re.Hints = &statusapi.EndpointHints{ForZones: e.Hints.ForZones, ForNodes: e.Hints.ForNodes}
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

func prefixStrings(ps []netip.Prefix) []string {
	if len(ps) == 0 {
		return nil
	}
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}
