package iptables

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/kpproxy/kp/proxy"
)

// Drift repair (proxy.DriftDetector): iptables sends no change events, so
// every --drift-check-period kp compares its chains in the kernel with
// what it wrote. The check is cheap when nothing changed: the tables'
// Stamp (stamp.go) has not moved since kp's last restore. Only when it
// moved (another program wrote, perhaps to its own chains) does the check
// read the tables (iptables-save of nat and filter) and compare every
// chain of kp's rule count with what kp wrote, and the jumps from the
// built-in chains. A drift makes the next Sync a full one, which rewrites
// every chain.

// chainRules is what kp wrote in one family's nat and filter tables, as a
// drift check compares it: each chain's rule count, and the jumps into
// them from built-in chains; owns tells kp's chains (of this mode) apart.
type chainRules struct {
	chains map[chainKey]int
	jumps  []jump
	owns   func(chain string) bool
}

// compare lists how kernel differs from what kp wrote: a chain missing, a
// chain with another count of rules (flushed, a rule deleted or added),
// a chain under kp's names that kp did not write, a jump from a built-in
// chain missing or doubled. At most a few are listed.
func (w *chainRules) compare(kernel map[Table]*Dump) []string {
	var diffs []string
	for _, t := range []Table{TableNAT, TableFilter} {
		d := kernel[t]
		if d == nil {
			d = &Dump{Table: t}
		}
		declared := make(map[string]bool, len(d.Chains))
		for _, c := range d.Chains {
			declared[c] = true
			if w.owns(c) {
				if _, ok := w.chains[chainKey{t, c}]; !ok {
					diffs = append(diffs, fmt.Sprintf("%s %s: a chain kp did not write", t, c))
				}
			}
		}
		for k, n := range w.chains {
			switch {
			case k.table != t:
			case !declared[k.name]:
				diffs = append(diffs, fmt.Sprintf("%s %s: deleted", t, k.name))
			case ruleCount(d, k.name) != n:
				diffs = append(diffs, fmt.Sprintf("%s %s: %s, kp wrote %d", t, k.name, Count(ruleCount(d, k.name), "rule"), n))
			}
		}
		for _, j := range w.jumps {
			if n := len(jumpRules(d, j)); j.table == t && n != 1 {
				diffs = append(diffs, fmt.Sprintf("%s %s: %s to %s, kp wrote 1", t, j.from, Count(n, "jump"), j.to))
			}
		}
	}
	slices.Sort(diffs)
	if len(diffs) > 5 {
		diffs = append(diffs[:5], fmt.Sprintf("and %d more", len(diffs)-5))
	}
	return diffs
}

// Count is n things, in words: "1 rule", "0 rules".
func Count(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}

// ruleCount is the number of rules of chain in d, whether ParseSave kept
// them or ParseSaveOthers counted them.
func ruleCount(d *Dump, chain string) int {
	if n, ok := d.OwnRules[chain]; ok {
		return n
	}
	return len(d.Rules[chain])
}

// readTables is iptables-save of the nat and filter tables of r, without
// the rules of kp's chains (counted in OwnRules).
func readTables(ctx context.Context, r Runner) (map[Table]*Dump, error) {
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

// OwnedDrift compares the kernel of r (in the calling thread's network
// namespace) with o, as WriteOwned wrote it: every chain under o.Prefix
// with its rule count, and o's jumps. It returns the differences, none
// when the kernel holds o (the userspace mode's drift check).
func OwnedDrift(ctx context.Context, r Runner, o OwnedRules) ([]string, error) {
	w := &chainRules{chains: map[chainKey]int{}, owns: func(c string) bool { return strings.HasPrefix(c, o.Prefix) }}
	for _, c := range o.Chains {
		w.chains[chainKey{c.Table, c.Name}] = c.ruleCount()
	}
	for _, j := range o.Jumps {
		w.jumps = append(w.jumps, j.internal())
	}
	kernel, err := readTables(ctx, r)
	if err != nil {
		return nil, err
	}
	return w.compare(kernel), nil
}

// driftState is the iptables mode's drift check: mu is held by Sync, so a
// check sees the books between syncs; writes counts kp's restores, so a
// check that read the kernel while kp wrote is dropped.
type driftState struct {
	mu      sync.Mutex
	writes  uint64
	stamps  map[proxy.Family]Stamp // after kp's last restore, or the last check that found nothing
	readers map[proxy.Family]*StampReader
	// stamp reads a Stamp (tests: a fake's).
	stamp func(Flavor, proxy.Family) (Stamp, error)
	// pending: a drift was reported; the next Sync is full.
	pending atomic.Bool
}

// readStamp reads fl's and f's Stamp; d.mu is held.
func (d *driftState) readStamp(fl Flavor, f proxy.Family) (Stamp, error) {
	if d.stamp != nil {
		return d.stamp(fl, f)
	}
	if d.readers == nil {
		d.readers = map[proxy.Family]*StampReader{}
	}
	r := d.readers[f]
	if r == nil || r.fl != fl {
		r = NewStampReader(fl, f)
		d.readers[f] = r
	}
	return r.Read()
}

// wrote records a restore of f by kp: the stamp after it is what the
// checks compare with. d.mu is held (Sync).
func (d *driftState) wrote(fl Flavor, f proxy.Family, ok bool) {
	d.writes++
	if d.stamps == nil {
		d.stamps = map[proxy.Family]Stamp{}
	}
	delete(d.stamps, f)
	if !ok {
		return
	}
	// A change another process makes between kp's restore and this read
	// is taken for kp's: it goes unseen until the tables change again.
	if s, err := d.readStamp(fl, f); err == nil {
		d.stamps[f] = s
	}
}

// DetectDrift implements proxy.DriftDetector: a check every
// cfg.DriftCheckPeriod (off at 0), in the calling process's network
// namespace, as the mode's syncs.
func (b *Backend) DetectDrift(ctx context.Context, drifted func(proxy.Drift)) error {
	defer b.drift.close()
	return proxy.PollDrift(ctx, b.cfg.DriftCheckPeriod, b.checkDrift, drifted, b.log)
}

var _ proxy.DriftDetector = (*Backend)(nil)

// checkDrift compares each family's chains in the kernel with what kp
// wrote (a proxy.DriftCheck).
func (b *Backend) checkDrift(ctx context.Context) (*proxy.Drift, error) {
	if b.drift.pending.Load() {
		return nil, nil // the next Sync repairs it; nothing new to say
	}
	fl := b.Flavor()
	if fl == "" || fl == FlavorAuto {
		return nil, nil
	}
	for _, f := range b.programmed() {
		diffs, err := b.checkFamily(ctx, fl, f)
		if err != nil {
			return nil, err
		}
		if len(diffs) > 0 {
			b.drift.pending.Store(true)
			return &proxy.Drift{What: fmt.Sprintf("iptables-%s %s: %s", fl, f, strings.Join(diffs, "; "))}, nil
		}
	}
	return nil, nil
}

// checkFamily is one family's check: nothing to read when the Stamp did
// not move since kp wrote; else the tables, compared with kp's books.
func (b *Backend) checkFamily(ctx context.Context, fl Flavor, f proxy.Family) ([]string, error) {
	d := &b.drift
	if !d.mu.TryLock() {
		return nil, nil // a sync runs: this check skips its turn (its wait would count as its cost)
	}
	bk := b.books[f]
	if bk == nil {
		d.mu.Unlock()
		return nil, nil // nothing synced, or the next sync is full anyway
	}
	base, known := d.stamps[f]
	cur, stampErr := d.readStamp(fl, f)
	if stampErr == nil && known && cur == base {
		d.mu.Unlock()
		return nil, nil
	}
	writes, want := d.writes, b.written(f, bk)
	d.mu.Unlock()

	kernel, err := readTables(ctx, b.runner(f))
	if err != nil {
		return nil, err
	}
	diffs := want.compare(kernel)
	if !d.mu.TryLock() {
		return nil, nil // a sync runs: what was read may be its doing
	}
	defer d.mu.Unlock()
	switch {
	case d.writes != writes || b.books[f] != bk:
		return nil, nil // kp wrote meanwhile: the next check compares again
	case len(diffs) == 0 && stampErr == nil:
		d.stamps[f] = cur // another program's change, not kp's chains
	}
	return diffs, nil
}

// written is what kp's books say family f's tables hold, as a check
// compares it. d.mu is held.
func (b *Backend) written(f proxy.Family, bk *book) *chainRules {
	w := &chainRules{chains: map[chainKey]int{}, jumps: b.jumps(f), owns: isKPChain}
	for _, c := range bk.skel {
		w.chains[chainKey{c.Table, c.Name}] = c.ruleCount()
	}
	for _, r := range bk.services {
		for _, c := range r.chains {
			w.chains[chainKey{c.Table, c.Name}] = c.ruleCount()
		}
	}
	return w
}

// close closes the stamp readers' sockets.
func (d *driftState) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range d.readers {
		r.Close()
	}
	d.readers = nil
}
