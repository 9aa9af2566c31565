package nft

import (
	"net/netip"

	"github.com/kpproxy/kp/proxy"
)

// EndpointCounters implements proxy.CounterReporter: each endpoint's new
// connections. NAT chains see only a connection's first packet, so:
//   - for Services without session affinity, the counter of the endpoint's
//     element in the endpoints map, which the kernel updates on the DNAT
//     rule's lookup (one per new connection). Elements are left alone while
//     their endpoint keeps its slot, so these counts survive changes to the
//     Service's other endpoints and kp's full syncs;
//   - for Services with session affinity, the sum of the counters of the
//     rules that DNAT to the endpoint in the Service's chains.
//
// Only s's service ports are read.
func (b *Backend) EndpointCounters(s *proxy.State) (map[proxy.EndpointRef]proxy.EndpointCounter, error) {
	out := map[proxy.EndpointRef]proxy.EndpointCounter{}
	add := func(ref proxy.EndpointRef, c Counter) {
		sum := out[ref]
		sum.Packets += c.Packets
		sum.Bytes += c.Bytes
		out[ref] = sum
	}
	var affinityChains []string
	for _, sp := range s.Services {
		if sp.AffinityTimeout > 0 {
			affinityChains = append(affinityChains, serviceChainName(sp), localChainName(sp))
		}
	}
	for _, f := range families {
		blocks := b.slotBlocks(f, s)
		bySlot, err := b.conn.ElementCounters(f, mapEndpoints)
		if err != nil {
			return nil, err
		}
		for name, sp := range s.Services {
			if sp.AffinityTimeout > 0 {
				continue
			}
			wanted := endpointSet(s.Endpoints[name])
			for _, chain := range pickChainNames(sp) {
				blk, ok := blocks[chain]
				if !ok {
					continue
				}
				for i, a := range blk.eps.all() {
					c, ok := bySlot[keyID(slotKey(blk.base+uint32(i)), false)]
					if ok && wanted[a] {
						add(proxy.EndpointRef{ServicePort: name, Endpoint: a}, c)
					}
				}
			}
		}
		if len(affinityChains) == 0 {
			continue
		}
		byChain, err := b.conn.DNATCounters(f, affinityChains)
		if err != nil {
			return nil, err
		}
		for name, sp := range s.Services {
			if sp.AffinityTimeout == 0 {
				continue
			}
			for _, e := range s.Endpoints[name] {
				for _, chain := range []string{serviceChainName(sp), localChainName(sp)} {
					if c, ok := byChain[chain][e.AddrPort()]; ok {
						add(proxy.EndpointRef{ServicePort: name, Endpoint: e.AddrPort()}, c)
					}
				}
			}
		}
	}
	return out, nil
}

// pickChainNames are the names of sp's pick chains, by which the slot table
// knows its blocks.
func pickChainNames(sp *proxy.ServicePort) []string {
	return []string{pickChainName(serviceChainName(sp)), pickChainName(localChainName(sp))}
}

// slotBlocks copies the blocks of s's policies in family f. A sync
// replaces a block's endpoint list, never changes it in place, so a copy of
// the block is a consistent view.
func (b *Backend) slotBlocks(f family, s *proxy.State) map[string]slotBlock {
	b.slotsMu.Lock()
	defer b.slotsMu.Unlock()
	out := map[string]slotBlock{}
	for _, sp := range s.Services {
		for _, chain := range pickChainNames(sp) {
			if blk := b.slots[f].blocks[chain]; blk != nil {
				out[chain] = *blk
			}
		}
	}
	return out
}

func endpointSet(eps []proxy.Endpoint) map[netip.AddrPort]bool {
	m := make(map[netip.AddrPort]bool, len(eps))
	for _, e := range eps {
		m[e.AddrPort()] = true
	}
	return m
}
