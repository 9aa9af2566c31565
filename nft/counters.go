package nft

import (
	"net/netip"

	"github.com/kpproxy/kp/proxy"
)

// EndpointCounters implements proxy.CounterReporter. Every rule that DNATs
// to an endpoint counts what reaches it, and NAT chains see only a
// connection's first packet, so the sum over a service port's chains of
// the rules that DNAT to an endpoint is the endpoint's new connections.
// Only s's service ports' chains are read.
func (b *Backend) EndpointCounters(s *proxy.State) (map[proxy.EndpointRef]proxy.EndpointCounter, error) {
	var chains []string
	for _, sp := range s.Services {
		chains = append(chains, serviceChainName(sp), localChainName(sp))
	}
	byChain := map[string]map[netip.AddrPort]Counter{}
	for _, f := range families {
		cs, err := b.conn.DNATCounters(f, chains)
		if err != nil {
			return nil, err
		}
		for chain, byTarget := range cs {
			m := byChain[chain]
			if m == nil {
				m = map[netip.AddrPort]Counter{}
				byChain[chain] = m
			}
			for t, c := range byTarget {
				m[t] = Counter{Packets: m[t].Packets + c.Packets, Bytes: m[t].Bytes + c.Bytes}
			}
		}
	}
	out := map[proxy.EndpointRef]proxy.EndpointCounter{}
	for name, sp := range s.Services {
		for _, e := range s.Endpoints[name] {
			var sum proxy.EndpointCounter
			found := false
			for _, chain := range []string{serviceChainName(sp), localChainName(sp)} {
				if c, ok := byChain[chain][e.AddrPort()]; ok {
					found = true
					sum.Packets += c.Packets
					sum.Bytes += c.Bytes
				}
			}
			if found {
				out[proxy.EndpointRef{ServicePort: name, Endpoint: e.AddrPort()}] = sum
			}
		}
	}
	return out, nil
}
