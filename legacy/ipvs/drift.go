package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/moby/ipvs"

	"github.com/kpproxy/kp/proxy"
)

// Drift repair (proxy.DriftDetector): IPVS sends no change events, so
// every --drift-check-period kp reads the virtual servers (one dump), the
// real servers of each of its own (one dump each) and kp-ipvs0's addresses,
// and compares them with what it wrote: a virtual server deleted or
// changed (ipvsadm -D, -E), a real server deleted, reweighted or added, a
// virtual server added on a Service address, a Service address deleted
// from kp-ipvs0. Real servers kp drains itself (weight 0, graceful.go) are
// kp's own doing. A drift makes the next Sync full, which reconciles every
// virtual server. kp's ipsets and KP-IPVS- chains are not compared (the
// hourly full sync repairs them).

// DetectDrift implements proxy.DriftDetector: a check every
// cfg.DriftCheckPeriod (off at 0).
func (b *Backend) DetectDrift(ctx context.Context, drifted func(proxy.Drift)) error {
	return proxy.PollDrift(ctx, b.cfg.DriftCheckPeriod, b.checkDrift, drifted, b.log)
}

var _ proxy.DriftDetector = (*Backend)(nil)

// checkDrift compares the kernel's IPVS state with what kp wrote (a
// proxy.DriftCheck). It holds b.mu: no sync or drain runs meanwhile.
func (b *Backend) checkDrift(context.Context) (*proxy.Drift, error) {
	if b.drifted.Load() {
		return nil, nil // the next Sync repairs it; nothing new to say
	}
	if !b.mu.TryLock() {
		return nil, nil // a sync or the drain runs: this check skips its turn (its wait would count as its cost)
	}
	defer b.mu.Unlock()
	if b.written == nil || b.handle == nil {
		return nil, nil // nothing synced, or the next sync is full anyway
	}
	servers, err := b.handle.GetServices()
	if err != nil {
		return nil, fmt.Errorf("list IPVS virtual servers: %w", err)
	}
	kernel := map[vsKey]*ipvs.Service{}
	for _, ks := range servers {
		if k, ok := kernelKey(ks); ok {
			kernel[k] = ks
		}
	}
	var diffs []string
	for _, f := range b.families {
		wr := b.written[f]
		if wr == nil {
			continue
		}
		for _, k := range sortedKeys(wr.servers) {
			d, err := b.serverDrift(k, wr.servers[k], kernel[k])
			if err != nil {
				return nil, err
			}
			diffs = append(diffs, d...)
		}
		for k := range kernel {
			if familyOf(k.Addr) == f && wr.servers[k] == nil && wr.addrs[k.Addr] > 0 && !b.excluded(k.Addr) {
				diffs = append(diffs, fmt.Sprintf("virtual server %s: added on a Service address", k))
			}
		}
	}
	addrDiffs, err := b.addrDrift()
	if err != nil {
		return nil, err
	}
	diffs = append(diffs, addrDiffs...)
	if len(diffs) == 0 {
		return nil, nil
	}
	slices.Sort(diffs)
	if len(diffs) > 5 {
		diffs = append(diffs[:5], fmt.Sprintf("and %d more", len(diffs)-5))
	}
	b.drifted.Store(true)
	return &proxy.Drift{What: "IPVS: " + strings.Join(diffs, "; ")}, nil
}

// serverDrift compares one virtual server kp wrote with the kernel's (nil:
// absent).
func (b *Backend) serverDrift(k vsKey, vs *VirtualServer, ks *ipvs.Service) ([]string, error) {
	if ks == nil {
		return []string{fmt.Sprintf("virtual server %s: deleted", k)}, nil
	}
	dests, err := b.handle.GetDestinations(ks)
	if err != nil {
		return nil, fmt.Errorf("read the real servers of %s: %w", k, err)
	}
	weights := map[ipvsDest]int{}
	for _, d := range dests {
		weights[ipvsDest{k, destAddrPort(d)}] = d.Weight
	}
	var diffs []string
	for _, o := range diffServer(k, vs, &kernelServer{svc: ks, dests: dests}, vs.Owner) {
		switch o.kind {
		case opUpdateServer:
			diffs = append(diffs, fmt.Sprintf("virtual server %s: scheduler or persistence changed", k))
		case opAddDest:
			diffs = append(diffs, fmt.Sprintf("virtual server %s: real server %s deleted", k, o.dest))
		case opRestoreDest:
			diffs = append(diffs, fmt.Sprintf("virtual server %s: real server %s at weight %d, kp wrote 1", k, o.dest, weights[ipvsDest{k, o.dest}]))
		case opDrainDest, opDelDest:
			if weights[ipvsDest{k, o.dest}] != 0 || !b.drain.has(k, o.dest) {
				diffs = append(diffs, fmt.Sprintf("virtual server %s: real server %s added", k, o.dest))
			}
		}
	}
	return diffs, nil
}

type ipvsDest struct {
	key  vsKey
	dest netip.AddrPort
}

// addrDrift compares kp-ipvs0's addresses with the Service addresses kp
// put there.
func (b *Backend) addrDrift() ([]string, error) {
	have, err := b.links.Addrs()
	if err != nil {
		return nil, fmt.Errorf("list the addresses of %s: %w", DummyName, err)
	}
	on := make(map[netip.Addr]bool, len(have))
	for _, a := range have {
		on[a] = true
	}
	var diffs []string
	for _, f := range b.families {
		if wr := b.written[f]; wr != nil {
			for a := range wr.addrs {
				if !on[a] {
					diffs = append(diffs, fmt.Sprintf("%s: address %s deleted", DummyName, a))
				}
			}
		}
	}
	return diffs, nil
}
