package ipvs

import (
	"fmt"
	"sync"
	"time"

	"github.com/kpproxy/kp/proxy"
)

// countersMaxAge bounds how often the status API's reads walk every
// virtual server's real servers (one netlink dump each): clients polling
// faster share one read.
const countersMaxAge = time.Second

type counterCache struct {
	mu  sync.Mutex
	at  time.Time
	out map[proxy.EndpointRef]proxy.EndpointCounter
}

// EndpointCounters implements proxy.CounterReporter from IPVS's per real
// server statistics, summed over a service port's virtual servers
// (ClusterIP, NodePorts, ...): Packets is the connections IPVS scheduled to
// the endpoint, Bytes the bytes both ways, Active its active connections
// now.
func (b *Backend) EndpointCounters(*proxy.State) (map[proxy.EndpointRef]proxy.EndpointCounter, error) {
	c := &b.counters
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if c.out != nil && now.Sub(c.at) < countersMaxAge && !now.Before(c.at) {
		return c.out, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.handle == nil || b.written == nil {
		return nil, nil
	}
	out := map[proxy.EndpointRef]proxy.EndpointCounter{}
	for _, wr := range b.written {
		for k, vs := range wr.servers {
			ds, err := b.handle.GetDestinations(keyService(k))
			if err != nil {
				return nil, fmt.Errorf("service port %s: read the real servers of %s: %w", vs.Owner, k, err)
			}
			for _, d := range ds {
				ref := proxy.EndpointRef{ServicePort: vs.Owner, Endpoint: destAddrPort(d)}
				sum := out[ref]
				sum.Packets += uint64(d.Stats.Connections)
				sum.Bytes += d.Stats.BytesIn + d.Stats.BytesOut
				active := int64(d.ActiveConnections)
				if sum.Active != nil {
					active += *sum.Active
				}
				sum.Active = &active
				out[ref] = sum
			}
		}
	}
	c.at, c.out = now, out
	return out, nil
}
