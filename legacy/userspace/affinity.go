package userspace

import (
	"context"
	"net/netip"
	"time"

	"github.com/kpproxy/kp/proxy"
)

// ListAffinity implements proxy.AffinityLister: the balancers' own memory
// of each client's endpoint, the entries still fresh. An entry holds for
// the listener it was made on: a service port's internal traffic
// (ClusterIPs) and its external traffic (NodePort, external addresses)
// each remember clients apart. s is not needed: the listeners know their
// service ports.
func (b *Backend) ListAffinity(ctx context.Context, _ *proxy.State) ([]proxy.AffinityEntry, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []proxy.AffinityEntry
	for key, p := range b.proxies {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		traffic := proxy.AffinityInternal
		if key.external {
			traffic = proxy.AffinityExternal
		}
		fb := p.balancers()
		for _, bal := range []*balancer{fb.v4, fb.v6, fb.clusterV4, fb.clusterV6} {
			for _, e := range bal.pinned() {
				out = append(out, proxy.AffinityEntry{ServicePort: key.name, Client: e.client.Unmap(), Endpoint: e.endpoint,
					Traffic: traffic, Expires: e.left})
			}
		}
	}
	return out, nil
}

type pinnedClient struct {
	client   netip.Addr
	endpoint netip.AddrPort
	left     time.Duration
}

// pinned are the balancer's fresh affinity entries, with what is left of
// each one's timeout.
func (b *balancer) pinned() []pinnedClient {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.timeout <= 0 {
		return nil
	}
	now := b.now()
	var out []pinnedClient
	for c, a := range b.affinity {
		if left := b.timeout - now.Sub(a.last); left > 0 {
			out = append(out, pinnedClient{client: c, endpoint: a.endpoint, left: left})
		}
	}
	return out
}
