package nft

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/google/nftables"

	"github.com/kpproxy/kp/proxy"
)

// TimedElement is an element of a set with timeouts: its key and what is
// left of its life.
type TimedElement struct {
	Key     []byte
	Expires time.Duration
}

// ListAffinity implements proxy.AffinityLister: each ClientIP-affinity
// endpoint's dynamic set (affinitySetName) holds the clients the endpoint
// got last, each until its timeout, which the rule that DNATs there
// renews ("update @set { ip saddr }"). Only s's service ports are read, one
// set per endpoint; a set the kernel does not have (an endpoint kp has not
// programmed) is skipped.
func (b *Backend) ListAffinity(ctx context.Context, s *proxy.State) ([]proxy.AffinityEntry, error) {
	var out []proxy.AffinityEntry
	for _, f := range families {
		for name, sp := range s.Services {
			if sp.AffinityTimeout <= 0 {
				continue
			}
			for _, e := range proxy.FilterEndpoints(f.pf, s.Endpoints[name]) {
				if err := ctx.Err(); err != nil {
					return out, err
				}
				set := affinitySetName(sp, e)
				elems, err := b.conn.TimedElements(f, set)
				if err != nil {
					return out, err
				}
				for _, el := range elems {
					client, ok := netip.AddrFromSlice(el.Key)
					if !ok {
						return out, fmt.Errorf("set %s %s %s: an element of %d bytes is no address", f.name, TableName, set, len(el.Key))
					}
					out = append(out, proxy.AffinityEntry{ServicePort: name, Client: client.Unmap(), Endpoint: e.AddrPort(), Expires: el.Expires})
				}
			}
		}
	}
	return out, nil
}

func (c *netlinkConn) TimedElements(f family, set string) (out []TimedElement, err error) {
	err = c.withReader(func(conn *nftables.Conn) error {
		elems, err := conn.GetSetElements(&nftables.Set{Table: nfTable(f), Name: set})
		if isNotFound(err) {
			return nil // no such set (or table) in this family
		}
		if err != nil {
			return fmt.Errorf("list elements of %s %s %s: %w", f.name, TableName, set, err)
		}
		for _, e := range elems {
			out = append(out, TimedElement{Key: e.Key, Expires: e.Expires})
		}
		return nil
	})
	return out, err
}
