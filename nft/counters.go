package nft

import "github.com/kpproxy/kp/proxy"

// EndpointCounters implements proxy.CounterReporter: each endpoint chain's
// named counter sits on its DNAT rule, which only a connection's first
// packet reaches (NAT chains see new connections only), so it counts new
// connections per endpoint.
func (b *Backend) EndpointCounters(s *proxy.State) (map[proxy.EndpointRef]proxy.EndpointCounter, error) {
	byChain, err := b.Counters()
	if err != nil {
		return nil, err
	}
	out := map[proxy.EndpointRef]proxy.EndpointCounter{}
	for name, sp := range s.Services {
		for _, e := range s.Endpoints[name] {
			if c, ok := byChain[endpointChainName(sp, e)]; ok {
				out[proxy.EndpointRef{ServicePort: name, Endpoint: e.AddrPort()}] = proxy.EndpointCounter{Packets: c.Packets, Bytes: c.Bytes}
			}
		}
	}
	return out, nil
}
