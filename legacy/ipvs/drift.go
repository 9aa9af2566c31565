package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/kpproxy/kp/proxy"
)

// Drift repair (proxy.DriftDetector): IPVS sends no change events, so
// every --drift-check-period kp reads the IPVS table (every virtual server
// with its real servers, in one read of /proc/net/ip_vs: table.go) and
// kp-ipvs0's addresses, and compares them with what it wrote: a virtual server deleted or
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
	kernel, err := b.readTable()
	if err != nil {
		return nil, err
	}
	var diffs []string
	for _, f := range b.families {
		wr := b.written[f]
		if wr == nil {
			continue
		}
		for k, vs := range wr.servers {
			diffs = append(diffs, b.serverDrift(k, vs, kernel[k])...)
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
func (b *Backend) serverDrift(k vsKey, vs *VirtualServer, ks *kernelServer) []string {
	if ks == nil {
		return []string{fmt.Sprintf("virtual server %s: deleted", k)}
	}
	if ks.procTimeout && ks.svc.Flags&ipvsFlagPersistent != 0 && sameTimeout(ks.svc.Timeout, vs.Timeout) {
		svc := *ks.svc
		svc.Timeout = vs.Timeout
		ks = &kernelServer{svc: &svc, dests: ks.dests}
	}
	weights := map[netip.AddrPort]int{}
	for _, d := range ks.dests {
		weights[destAddrPort(d)] = d.Weight
	}
	var diffs []string
	for _, o := range diffServer(k, vs, ks, vs.Owner) {
		switch o.kind {
		case opUpdateServer:
			diffs = append(diffs, fmt.Sprintf("virtual server %s: scheduler or persistence changed", k))
		case opAddDest:
			diffs = append(diffs, fmt.Sprintf("virtual server %s: real server %s deleted", k, o.dest))
		case opRestoreDest:
			diffs = append(diffs, fmt.Sprintf("virtual server %s: real server %s at weight %d, kp wrote 1", k, o.dest, weights[o.dest]))
		case opDrainDest, opDelDest:
			if weights[o.dest] != 0 || !b.drain.has(k, o.dest) {
				diffs = append(diffs, fmt.Sprintf("virtual server %s: real server %s added", k, o.dest))
			}
		}
	}
	return diffs
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
