package iptables

import (
	"bytes"
	"cmp"
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
	if err := b.resolveFlavor(ctx); err != nil {
		return err
	}
	b.checkLocalhost()
	full := b.books == nil || s.NodeChanged || s.ServiceCIDRsChanged || b.now().Sub(b.lastFull) > fullSyncInterval
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
	out := map[Table]*Dump{}
	for _, t := range []Table{TableFilter, TableNAT} {
		data, err := r.Save(ctx, t, false)
		if err != nil {
			return nil, fmt.Errorf("read the %s table (%s): %w", t, r.Family(), err)
		}
		dumps, err := parseSave(data, true)
		if err != nil {
			return nil, fmt.Errorf("read the %s table (%s): %w", t, r.Family(), err)
		}
		if d := dumps[t]; d != nil {
			out[t] = d
		} else {
			out[t] = &Dump{Table: t}
		}
	}
	return out, nil
}

// input is one iptables-restore input being written, with the owner of
// every line, so a refused line names its service port.
type input struct {
	buf bytes.Buffer
	n   int // lines written
	// runs hold the owner of the lines from first on, up to the next run:
	// a chain's lines share theirs, and one entry per line would be 35 MB
	// at 10,000 Services.
	runs    []ownerRun
	written map[chainKey]string
	changes int
	rules   map[Table]int // rule lines sent, per table
	hinted  bool          // holds cacheHintLine
}

type lineOwner struct {
	owner proxy.ServicePortName
	chain string
}

type ownerRun struct {
	first int // line number, from 1
	lineOwner
}

func (in *input) line(s string, owner proxy.ServicePortName, chain string) {
	in.buf.WriteString(s)
	in.buf.WriteByte('\n')
	in.n++
	lo := lineOwner{owner, chain}
	if k := len(in.runs); k == 0 || in.runs[k-1].lineOwner != lo {
		in.runs = append(in.runs, ownerRun{in.n, lo})
	}
}

// ownerOf is the owner of line n (from 1, at most in.n).
func (in *input) ownerOf(n int) lineOwner {
	i, _ := slices.BinarySearchFunc(in.runs, n+1, func(r ownerRun, n int) int { return cmp.Compare(r.first, n) })
	return in.runs[i-1].lineOwner
}

func (in *input) empty() bool { return in.changes == 0 }

// cacheHintLine is a list command (iptables -S of the whole table) that
// kp puts in a big iptables-nft-restore input for its side effect on the
// tool's cache; its output is discarded. iptables-nft 1.8.9 (Debian 12's)
// with --noflush keeps, per restore, a sorted linked list of every chain
// the input names (a rule's chain and its jump target), to fetch only those
// chains from the kernel; each line walks that list with strcmp, so an
// input of c chains and l lines costs l·c/2 compares: at 1,000 Services ×
// 10 endpoints (11,000 chains, 33,000 rules) 9–17 s of CPU, at 3,000 153 s,
// at 10,000 it never finished here (upstream's iptables mode, which has the
// same shape, did not finish in 6 minutes). A command that names no chain
// makes the tool fetch the whole table instead and stop keeping the list:
// the same 1,000 Services then take 0.4 s, 10,000 take 16 s (the rest is
// its 512-bucket chain hash). Reading the whole table costs what listing
// it does (4 s at 10,000 Services), so partial syncs that write few chains
// go without it.
const cacheHintLine = "-S"

// cacheHintMinChains is the number of written chains from which a partial
// sync uses the hint: where the list's cost (quadratic in chains) passes
// that of reading a large table (linear in it).
const cacheHintMinChains = 4096

// cacheHint reports whether an input that writes or deletes chains
// chains gets cacheHintLine: iptables-nft only (iptables-legacy's libiptc
// keeps an index of chains and does not need it), while it has not been
// refused (an iptables that does not take -S in a restore).
func (b *Backend) cacheHint(full bool, chains int) bool {
	return b.Flavor() == FlavorNFT && !b.noCacheHint && (full || chains >= cacheHintMinChains)
}

// restoreInput writes the nat then the filter block. Each is atomic, not
// the pair: nat goes first because it holds the rules iptables-restore may
// refuse (matches and targets per service: recent, statistic, DNAT), and
// a refused nat block stops the input before filter, leaving the kernel as
// it was. (A refused filter block leaves nat applied; the next sync is
// full and rewrites both.) Within a block: the
// chain lines of every chain written or deleted, the rules, the jumps from
// built-in chains, then the deletions (a chain is deleted only after every
// rule naming it was flushed or rewritten).
func (b *Backend) restoreInput(f proxy.Family, bk *book, want []*Chain, kernel map[Table]*Dump, full bool, staged map[chainKey]string) *input {
	in := &input{written: map[chainKey]string{}, rules: map[Table]int{}}
	if !full {
		for k, v := range bk.written {
			in.written[k] = v
		}
	}
	for k, v := range staged {
		in.written[k] = v
	}
	wanted := map[chainKey]bool{}
	for _, c := range want {
		wanted[chainKey{c.Table, c.Name}] = true
	}
	for _, t := range []Table{TableNAT, TableFilter} {
		var write []*Chain
		for _, c := range want {
			if c.Table != t {
				continue
			}
			k := chainKey{t, c.Name}
			if _, ok := staged[k]; ok {
				continue
			}
			if d := c.digest(); full || bk.written[k] != d {
				write = append(write, c)
				in.written[k] = d
			}
		}
		var gone []string
		if full {
			for _, name := range kernel[t].Chains {
				if isKPChain(name) && !wanted[chainKey{t, name}] {
					gone = append(gone, name)
				}
			}
		} else {
			for k := range bk.written {
				if k.table == t && !wanted[k] {
					gone = append(gone, k.name)
				}
			}
		}
		slices.Sort(gone)
		var jumps []jump
		var extra []string // "-D" lines of duplicated jumps
		if full {
			for _, j := range b.jumps(f) {
				if j.table != t {
					continue
				}
				found := jumpRules(kernel[t], j)
				if len(found) == 0 {
					jumps = append(jumps, j)
				}
				for _, r := range found[min(1, len(found)):] {
					extra = append(extra, "-D "+j.from+" "+r.Spec)
				}
			}
		}
		if len(write)+len(gone)+len(jumps)+len(extra) == 0 {
			continue
		}
		in.changes += len(write) + len(gone) + len(jumps) + len(extra)
		none := proxy.ServicePortName{}
		in.line("*"+string(t), none, "")
		// The jumps from built-in chains come first, after their targets'
		// chain lines: iptables-nft creates a missing built-in chain only
		// for a rule sent before the cache hint below.
		targets := map[string]bool{}
		for _, j := range jumps {
			targets[j.to] = true
		}
		for _, c := range write {
			if targets[c.Name] {
				in.line(":"+c.Name+" - [0:0]", ownerOf(c), c.Name)
			}
		}
		for _, j := range jumps {
			in.line(j.line(), none, j.from)
		}
		for _, l := range extra {
			in.line(l, none, strings.Fields(l)[1])
		}
		// A full sync that staged its new chains writes what the kernel
		// held already: few chains on a cold start, all of them on a
		// restart.
		if b.cacheHint(full && len(staged) == 0, len(write)+len(gone)) {
			in.line(cacheHintLine, none, "")
			in.hinted = true
		}
		for _, c := range write {
			if !targets[c.Name] {
				in.line(":"+c.Name+" - [0:0]", ownerOf(c), c.Name)
			}
		}
		for _, name := range gone {
			in.line(":"+name+" - [0:0]", none, name)
			delete(in.written, chainKey{t, name})
		}
		for _, c := range write {
			for _, r := range c.Rules {
				in.line(r.line(c.Name), r.Owner, c.Name)
			}
			in.rules[t] += len(c.Rules)
		}
		for _, name := range gone {
			in.line("-X "+name, none, name)
		}
		in.line("COMMIT", none, "")
	}
	return in
}

// ownerOf is the service port a chain belongs to, when all its rules do.
func ownerOf(c *Chain) proxy.ServicePortName {
	if len(c.Rules) == 0 {
		return proxy.ServicePortName{}
	}
	o := c.Rules[0].Owner
	for _, r := range c.Rules[1:] {
		if r.Owner != o {
			return proxy.ServicePortName{}
		}
	}
	return o
}

// jumpRules is the rules of the saved table that are j: rules of j.from
// that target j.to and carry j's comment (iptables-save's spelling of the
// matches differs between flavors, the target and comment do not). A full
// sync inserts j when there is none and deletes all but the first when
// something (a second proxy instance, a hand edit) duplicated it: each by
// its saved spec, which deletes that rule and never another one.
func jumpRules(d *Dump, j jump) []SavedRule {
	var out []SavedRule
	for _, r := range d.Rules[j.from] {
		if strings.Contains(r.Spec, "-j "+j.to) && (strings.HasSuffix(r.Spec, "-j "+j.to) || strings.Contains(r.Spec, "-j "+j.to+" ")) &&
			strings.Contains(r.Spec, j.comment) {
			out = append(out, r)
		}
	}
	return out
}

// explain names the service port of the line iptables-restore refused.
func (in *input) explain(f proxy.Family, err error) error {
	var re *RestoreError
	if !errors.As(err, &re) || re.Line < 1 || re.Line > in.n {
		return fmt.Errorf("%s iptables-restore: %w", f, err)
	}
	lo := in.ownerOf(re.Line)
	if lo.owner != (proxy.ServicePortName{}) {
		return fmt.Errorf("%s: iptables-restore refused a rule of service port %s (chain %s): %w", f, lo.owner, lo.chain, err)
	}
	if lo.chain != "" {
		return fmt.Errorf("%s: iptables-restore refused a rule of kp's chain %s: %w", f, lo.chain, err)
	}
	return fmt.Errorf("%s iptables-restore: %w", f, err)
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
