package iptables

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/kpproxy/kp/proxy"
)

// Sync makes the kernel match s: one iptables-restore --noflush per family,
// holding the filter and nat tables' blocks, each applied atomically by
// the kernel. A full sync (the first, after a failure, when the Node or the
// service CIDRs changed, and every fullSyncInterval) reads the kernel,
// declares and rewrites every KP- chain (a chain line flushes it within
// the same atomic commit, so packets never see it empty), deletes the KP-
// chains nobody wants any more, and re-inserts missing jumps from the
// built-in chains. A partial sync re-renders s.Changed only and writes the
// chains whose contents differ from what kp last wrote: the changed
// service ports' chains and the dispatch leaves that name them.
func (b *Backend) Sync(ctx context.Context, s *proxy.State) error {
	b.drift.mu.Lock()
	defer b.drift.mu.Unlock()
	if err := b.resolveFlavor(ctx); err != nil {
		return err
	}
	b.checkLocalhost()
	full := b.drift.pending.Swap(false) || b.books == nil || s.NodeChanged || s.ServiceCIDRsChanged || b.now().Sub(b.lastFull) > fullSyncInterval
	if full {
		b.books = map[proxy.Family]*book{}
	}
	for _, f := range b.programmed() {
		bk := b.books[f]
		if bk == nil {
			bk = &book{services: map[proxy.ServicePortName]*rendered{}, written: map[chainKey]string{}}
			b.books[f] = bk
		}
		if err := b.syncFamily(ctx, f, bk, s, full); err != nil {
			b.books = nil
			return err
		}
	}
	b.lastSyncFull = full
	if full {
		b.lastFull = b.now()
	}
	return nil
}

// syncFamily renders, diffs and applies one family.
func (b *Backend) syncFamily(ctx context.Context, f proxy.Family, bk *book, s *proxy.State, full bool) error {
	r := b.runner(f)
	shared := full
	if full {
		clear(bk.services)
		for name, sp := range s.Services {
			bk.services[name] = b.renderInjected(f, sp, s.Endpoints[name], s.Node)
		}
	} else {
		for name := range s.Changed {
			old := bk.services[name]
			if sp := s.Services[name]; sp != nil {
				bk.services[name] = b.renderInjected(f, sp, s.Endpoints[name], s.Node)
			} else {
				delete(bk.services, name)
			}
			shared = shared || !sameShared(old, bk.services[name])
		}
	}
	npDsts, cidrs := b.nodePortDestinations(f, s.Node), proxy.FilterPrefixes(f, s.ServiceCIDRs)
	key := fmt.Sprint(npDsts, cidrs, b.localhostNodePorts)
	if shared || bk.skel == nil || key != bk.skelKey {
		bk.skel, bk.skelKey = b.skeleton(f, bk.services, npDsts, cidrs), key
	}
	want := slices.Clone(bk.skel)
	for _, name := range sortedNames(bk.services) {
		want = append(want, bk.services[name].chains...)
	}

	var kernel map[Table]*Dump
	if full {
		var err error
		if kernel, err = b.readKernel(ctx, r); err != nil {
			return err
		}
	}
	var staged map[chainKey]string
	var stagedRules map[Table]int
	if full && b.staging() {
		var err error
		if staged, stagedRules, err = b.stage(ctx, r, f, want, kernel); err != nil {
			b.metrics.failed(f, full)
			return err
		}
	}
	in := b.restoreInput(f, bk, want, kernel, full, staged)
	for t, n := range stagedRules {
		in.rules[t] += n
	}
	if in.empty() {
		b.metrics.synced(f, want, in)
		return nil
	}
	data := in.buf.Bytes()
	err := r.Restore(ctx, data)
	defer func() { b.drift.wrote(r.Flavor(), f, err == nil) }()
	// An iptables that refuses the hint, or crashes with it (iptables-nft
	// 1.8.9 crashed once loading a 10,000-Service listing with it, though
	// never on kp's own inputs), gets the input again without it, and no
	// hint after.
	if re := (*RestoreError)(nil); in.hinted && errors.As(err, &re) && (re.Text == cacheHintLine || re.Crashed) {
		b.log.Warn("iptables-restore fails with a list command; big syncs will be slow with this iptables", "backend", r, "err", err)
		b.noCacheHint = true
		in = b.restoreInput(f, bk, want, kernel, full, staged)
		data = in.buf.Bytes()
		err = r.Restore(ctx, data)
	}
	if err != nil {
		b.metrics.failed(f, full)
		return in.explain(f, err)
	}
	bk.written = in.written
	b.metrics.synced(f, want, in)
	bk.compact()
	return nil
}

// compact drops the rules of every service port's chains once the kernel
// holds them, keeping each chain's name and digest: later syncs compare
// digests only, and a service port is rendered again before its chains are
// written again (a change re-renders it, a full sync re-renders all). At
// 10,000 Services × 10 endpoints the rules are ~65 MB of heap that would
// otherwise live between syncs.
func (bk *book) compact() {
	for _, r := range bk.services {
		for _, c := range r.chains {
			c.compact()
		}
	}
}

func (b *Backend) renderInjected(f proxy.Family, sp *proxy.ServicePort, eps []proxy.Endpoint, node proxy.Node) *rendered {
	out := b.render(f, sp, eps, node)
	if args, ok := b.inject[sp.Name]; ok && len(out.chains) > 0 {
		c := out.chains[0]
		c.Rules = append(slices.Clone(c.Rules), Rule{Comment: sp.Name.String() + " injected", Args: args, Owner: sp.Name})
	}
	return out
}

// readKernel is iptables-save of the filter and nat tables.
func (b *Backend) readKernel(ctx context.Context, r Runner) (map[Table]*Dump, error) {
	return readTables(ctx, r)
}

// sameShared reports whether two renderings of a service port add the same
// rules to the shared chains (nil is a port with none).
func sameShared(a, b *rendered) bool {
	if a == nil || b == nil {
		return a == b
	}
	return reflect.DeepEqual(a.natServices, b.natServices) && reflect.DeepEqual(a.natNodePorts, b.natNodePorts) &&
		reflect.DeepEqual(a.filterServices, b.filterServices) && reflect.DeepEqual(a.filterExternal, b.filterExternal) &&
		reflect.DeepEqual(a.firewall, b.firewall) && reflect.DeepEqual(a.healthChecks, b.healthChecks)
}

func sortedNames(m map[proxy.ServicePortName]*rendered) []proxy.ServicePortName {
	names := make([]proxy.ServicePortName, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.SortFunc(names, compareNames)
	return names
}

func containsWord(spec, w string) bool {
	for _, f := range strings.Fields(spec) {
		if f == w {
			return true
		}
	}
	return false
}
