package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/moby/ipvs"

	"github.com/kpproxy/kp/legacy/iptables"
	"github.com/kpproxy/kp/proxy"
)

// Sync makes the kernel match s. A full sync (the first, after a failure,
// when the Node, its NodePort addresses or the service CIDRs changed, after
// another process changed kp's state (drift.go), and hourly) re-renders
// every service port and reconciles every virtual server kp owns against
// the kernel's; a partial sync re-renders s.Changed only and touches only
// their virtual servers, real servers, addresses and set entries. Either
// way the IPVS state is read back from the kernel before it is changed, so
// a sync after a failed one reconciles from what is really there.
func (b *Backend) Sync(ctx context.Context, s *proxy.State) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.setup(ctx); err != nil {
		return err
	}
	dummy := map[netip.Addr]bool{}
	for _, wr := range b.written {
		for a := range wr.addrs {
			dummy[a] = true
		}
	}
	nodeAddrs := map[proxy.Family][]netip.Addr{}
	full := b.drifted.Swap(false) || b.written == nil || s.NodeChanged || s.ServiceCIDRsChanged || b.now().Sub(b.lastFull) > fullSyncInterval
	for _, f := range b.families {
		nodeAddrs[f] = b.nodePortAddrs(f, s.Node, dummy)
		if wr := b.written[f]; wr != nil && !slices.Equal(wr.nodeAddrs, nodeAddrs[f]) {
			full = true
		}
	}
	var err error
	if full {
		err = b.syncFull(ctx, s, nodeAddrs)
	} else {
		err = b.syncPartial(ctx, s, nodeAddrs)
	}
	b.lastSyncFull = full
	if err != nil {
		b.written = nil
		return err
	}
	if full {
		b.lastFull = b.now()
	}
	if b.drain.len() > 0 {
		if err := b.drain.check(b.handle, b.now()); err != nil {
			b.log.Warn("drained real servers", "err", err)
		}
	}
	return nil
}

func (b *Backend) renderInput(f proxy.Family, s *proxy.State, nodeAddrs []netip.Addr) renderInput {
	return renderInput{family: f, scheduler: b.scheduler(), node: s.Node, nodeAddrs: nodeAddrs}
}

// syncFull re-renders everything and reconciles it with the kernel.
func (b *Backend) syncFull(ctx context.Context, s *proxy.State, nodeAddrs map[proxy.Family][]netip.Addr) error {
	if err := b.links.Ensure(); err != nil {
		return err
	}
	next := b.renderAll(s, nodeAddrs)
	have, err := b.readKernel(ctx)
	if err != nil {
		return err
	}
	// Addresses first: a new Service's packets must reach INPUT.
	want, err := b.addAddrs(next, have.onDummy)
	if err != nil {
		return err
	}
	if err := b.reconcileServers(next, have); err != nil {
		return err
	}
	if err := b.ipset.Restore(ctx, fullSetsInput(next, b.families)); err != nil {
		return err
	}
	if err := b.writeRules(ctx, s.ServiceCIDRs); err != nil {
		return err
	}
	for _, a := range have.addrs {
		if !want[a] {
			if err := b.links.DelAddr(a); err != nil {
				return err
			}
		}
	}
	b.written = next
	return nil
}

// renderAll renders every service port of s, per family: what a full sync
// will have written once it succeeds.
func (b *Backend) renderAll(s *proxy.State, nodeAddrs map[proxy.Family][]netip.Addr) map[proxy.Family]*written {
	next := map[proxy.Family]*written{}
	for _, f := range b.families {
		wr := newWritten()
		wr.nodeAddrs = nodeAddrs[f]
		in := b.renderInput(f, s, nodeAddrs[f])
		for name, sp := range s.Services {
			wr.set(name, render(in, sp, s.Endpoints[name]), newChange())
		}
		next[f] = wr
	}
	return next
}

// kernelState is what a full sync reads from the kernel before it changes
// anything.
type kernelState struct {
	// addrs are kp-ipvs0's addresses; onDummy the same, as a set.
	addrs   []netip.Addr
	onDummy map[netip.Addr]bool
	// owned are the virtual servers recorded as kp's in the
	// KP-IPVS-SERVERS sets.
	owned map[vsKey]bool
	// servers are every virtual server of the namespace, kp's or not.
	servers []*ipvs.Service
}

// readKernel reads the virtual servers, which of them are kp's (recorded
// in the KP-IPVS-SERVERS sets, or on kp-ipvs0's addresses), and kp-ipvs0's
// addresses.
func (b *Backend) readKernel(ctx context.Context) (*kernelState, error) {
	sets, err := b.ipset.List(ctx)
	if err != nil {
		return nil, err
	}
	have := &kernelState{onDummy: map[netip.Addr]bool{}, owned: map[vsKey]bool{}}
	if have.addrs, err = b.links.Addrs(); err != nil {
		return nil, err
	}
	for _, a := range have.addrs {
		have.onDummy[a] = true
	}
	for _, f := range []proxy.Family{proxy.IPv4, proxy.IPv6} {
		for _, e := range sets[setName(f, setServers)] {
			if k, ok := parseIPPort(e); ok {
				have.owned[k] = true
			}
		}
	}
	if have.servers, err = b.handle.GetServices(); err != nil {
		return nil, fmt.Errorf("list IPVS virtual servers: %w", err)
	}
	return have, nil
}

// addAddrs puts on kp-ipvs0 every address next needs that it lacks, and
// returns the addresses next needs (the others go once the rest is
// written).
func (b *Backend) addAddrs(next map[proxy.Family]*written, onDummy map[netip.Addr]bool) (map[netip.Addr]bool, error) {
	want := map[netip.Addr]bool{}
	for _, wr := range next {
		for a := range wr.addrs {
			want[a] = true
			if !onDummy[a] {
				if err := b.links.AddAddr(a); err != nil {
					return nil, err
				}
			}
		}
	}
	return want, nil
}

// reconcileServers makes the kernel's virtual servers match next: each
// one the kernel holds is updated, or deleted when it is kp's and next
// lacks it (another program's are left alone, as are kp's in excluded
// CIDRs); then the ones next adds are created, in key order.
func (b *Backend) reconcileServers(next map[proxy.Family]*written, have *kernelState) error {
	seen := map[vsKey]bool{}
	for _, ks := range have.servers {
		k, ok := kernelKey(ks)
		if !ok {
			continue
		}
		seen[k] = true
		var vs *VirtualServer
		if wr := next[familyOf(k.Addr)]; wr != nil {
			vs = wr.servers[k]
		}
		if vs == nil && !(have.owned[k] || have.onDummy[k.Addr]) {
			continue // another program's
		}
		if vs == nil && b.excluded(k.Addr) {
			continue
		}
		cur := &kernelServer{svc: ks}
		if vs != nil {
			var err error
			if cur.dests, err = b.handle.GetDestinations(ks); err != nil {
				return fmt.Errorf("service port %s: read the real servers of %s: %w", vs.Owner, k, err)
			}
		}
		if err := b.applyAll(diffServer(k, vs, cur, proxy.ServicePortName{})); err != nil {
			return err
		}
	}
	for _, wr := range next {
		for _, k := range sortedKeys(wr.servers) {
			if !seen[k] {
				if err := b.applyAll(diffServer(k, wr.servers[k], nil, proxy.ServicePortName{})); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// syncPartial re-renders the changed service ports.
func (b *Backend) syncPartial(ctx context.Context, s *proxy.State, nodeAddrs map[proxy.Family][]netip.Addr) error {
	changes := map[proxy.Family]*change{}
	for _, f := range b.families {
		wr := b.written[f]
		c := newChange()
		in := b.renderInput(f, s, nodeAddrs[f])
		for _, name := range sortedNames(s.Changed) {
			if sp := s.Services[name]; sp != nil {
				wr.set(name, render(in, sp, s.Endpoints[name]), c)
			} else {
				wr.set(name, nil, c)
			}
		}
		c.settle()
		changes[f] = c
	}
	for _, f := range b.families {
		for _, a := range changes[f].addAddrs {
			if err := b.links.AddAddr(a); err != nil {
				return err
			}
		}
	}
	for _, f := range b.families {
		c, wr := changes[f], b.written[f]
		for _, k := range sortedKeys(c.servers) {
			vs := wr.servers[k]
			have, err := b.readServer(k, vs != nil)
			if err != nil {
				return fmt.Errorf("service port %s: %w", c.serversOwners[k], err)
			}
			if err := b.applyAll(diffServer(k, vs, have, c.serversOwners[k])); err != nil {
				return err
			}
		}
	}
	if in := partialSetsInput(changes, b.families); len(in) > 0 {
		if err := b.ipset.Restore(ctx, in); err != nil {
			return err
		}
	}
	for _, f := range b.families {
		for _, a := range changes[f].delAddrs {
			if err := b.links.DelAddr(a); err != nil {
				return err
			}
		}
	}
	return nil
}

// readServer reads one virtual server back from the kernel (nil when
// absent), with its real servers when dests is set.
func (b *Backend) readServer(k vsKey, dests bool) (*kernelServer, error) {
	ks := keyService(k)
	if !b.handle.IsServicePresent(ks) {
		return nil, nil
	}
	svc, err := b.handle.GetService(ks)
	if err != nil {
		return nil, fmt.Errorf("read virtual server %s: %w", k, err)
	}
	have := &kernelServer{svc: svc}
	if dests {
		if have.dests, err = b.handle.GetDestinations(svc); err != nil {
			return nil, fmt.Errorf("read the real servers of %s: %w", k, err)
		}
	}
	return have, nil
}

// applyAll sends ops in order and keeps the drain list current.
func (b *Backend) applyAll(ops []op) error {
	now := b.now()
	for _, o := range ops {
		if err := apply(b.handle, o); err != nil {
			return err
		}
		switch o.kind {
		case opDrainDest:
			b.drain.add(o.key, o.dest, now)
		case opAddDest, opRestoreDest, opDelDest:
			b.drain.forget(o.key, o.dest)
		}
	}
	return nil
}

// writeRules writes the chains and the missing jumps, per family, in one
// iptables-restore each.
func (b *Backend) writeRules(ctx context.Context, serviceCIDRs []netip.Prefix) error {
	for _, f := range b.families {
		r := b.runner(b.flavor, f)
		saved := map[iptables.Table]*iptables.Dump{}
		for _, t := range []iptables.Table{iptables.TableNAT, iptables.TableFilter} {
			data, err := r.Save(ctx, t, false)
			if err != nil {
				return fmt.Errorf("read the %s table (%s): %w", t, f, err)
			}
			dumps, err := iptables.ParseSave(data)
			if err != nil {
				return fmt.Errorf("read the %s table (%s): %w", t, f, err)
			}
			saved[t] = dumps[t]
		}
		notLocal, _ := iptables.LocalMatch(b.cfg, f, true)
		chains := renderChains(rulesInput{family: f, masqMark: b.masqMark, masqueradeAll: b.cfg.MasqueradeAll,
			notLocal: notLocal, serviceCIDRs: serviceCIDRs})
		if err := r.Restore(ctx, restoreInput(chains, saved)); err != nil {
			return fmt.Errorf("%s: write the ipvs mode's iptables chains: %w", f, err)
		}
	}
	return nil
}

func (b *Backend) excluded(a netip.Addr) bool {
	return slices.ContainsFunc(b.cfg.IPVS.ExcludeCIDRs, func(p netip.Prefix) bool { return p.Contains(a) })
}

func familyOf(a netip.Addr) proxy.Family {
	if a.Is4() {
		return proxy.IPv4
	}
	return proxy.IPv6
}

func sortedKeys[V any](m map[vsKey]V) []vsKey {
	out := make([]vsKey, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b vsKey) int { return strings.Compare(a.String(), b.String()) })
	return out
}

func sortedNames(m map[proxy.ServicePortName]struct{}) []proxy.ServicePortName {
	out := make([]proxy.ServicePortName, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b proxy.ServicePortName) int {
		return strings.Compare(a.String()+string(a.Protocol), b.String()+string(b.Protocol))
	})
	return out
}
