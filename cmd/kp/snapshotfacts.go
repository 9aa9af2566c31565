package main

import (
	"context"
	"errors"
	"net/netip"
	"sort"
	"strings"

	"github.com/kpproxy/kp/conntrack"
	"github.com/kpproxy/kp/nft"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// snapshotFacts completes kp proxy's /kp/v1/snapshot from its own network
// namespace (server.SnapshotFacts): the local addresses, where NodePorts
// answer by the running mode's scope, and the conntrack entries addressed
// to a Service.
func snapshotFacts(dial conntrack.Dialer) func(ctx context.Context, st *proxy.State, snap *statusapi.Snapshot) {
	return func(_ context.Context, st *proxy.State, snap *statusapi.Snapshot) {
		var errs []error
		local, err := proxy.LocalAddrs()
		errs = append(errs, err)
		snap.Proxy.LocalAddresses = addrStrings(local)
		if st != nil {
			scope := proxy.NodePortScope{Primary: snap.Proxy.NodePortPrimary}
			for _, s := range snap.Proxy.NodePortAddresses {
				if p, err := netip.ParsePrefix(s); err == nil {
					scope.CIDRs = append(scope.CIDRs, p)
				}
			}
			var routed []netip.Addr
			if scope.Primary {
				routed, err = nft.DefaultRouteAddrs()
				errs = append(errs, err)
			}
			snap.Proxy.NodePortIPs = addrStrings(proxy.NodePortAddrs(st, scope, local, routed))
		}
		if err := errors.Join(errs...); err != nil {
			snap.Proxy.Error = err.Error()
		}
		snap.Conntrack, err = serviceFlows(dial, st, local)
		if err != nil {
			snap.ConntrackError = err.Error()
		}
	}
}

// maxSnapshotFlows bounds the conntrack entries a snapshot carries: a
// busy node has hundreds of thousands, and the file is for a bug report.
const maxSnapshotFlows = 10000

// serviceFlows lists the conntrack entries whose original destination is a
// Service address of st, at most maxSnapshotFlows of them.
func serviceFlows(dial conntrack.Dialer, st *proxy.State, local []netip.Addr) ([]statusapi.ConntrackEntry, error) {
	if st == nil {
		return nil, nil
	}
	c, err := dial.Open()
	if err != nil {
		return nil, permissionHint(err)
	}
	defer c.Close()
	flows, err := c.Dump()
	if err != nil {
		return nil, permissionHint(err)
	}
	ix := conntrack.NewIndex(st, local)
	var out []statusapi.ConntrackEntry
	for _, f := range flows {
		if _, ok := ix.Attribute(f); !ok {
			continue
		}
		if len(out) == maxSnapshotFlows {
			return out, errors.New("more conntrack entries to Services than a snapshot keeps (10000): the rest are left out")
		}
		out = append(out, statusapi.ConntrackEntry{Protocol: strings.ToLower(f.ProtocolName()),
			OrigSrc: f.Orig.Src.String(), OrigDst: f.Orig.Dst.String(), ReplySrc: f.Reply.Src.String(), ReplyDst: f.Reply.Dst.String(),
			State: f.State(), TimeoutSeconds: int64(f.Timeout.Seconds())})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].OrigDst != out[j].OrigDst {
			return out[i].OrigDst < out[j].OrigDst
		}
		return out[i].OrigSrc < out[j].OrigSrc
	})
	return out, nil
}

func addrStrings(addrs []netip.Addr) []string {
	var out []string
	for _, a := range addrs {
		out = append(out, a.String())
	}
	return out
}
