package iptables

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kpproxy/kp/proxy"
)

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
// full and rewrites both.) Each block is planned (planTable) before it is
// written (writeTable); a table with nothing to change gets no block.
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
		e := b.planTable(t, f, bk, want, wanted, kernel, full, staged, in.written)
		if e.size() == 0 {
			continue
		}
		in.changes += e.size()
		// A full sync that staged its new chains writes what the kernel
		// held already: few chains on a cold start, all of them on a
		// restart.
		b.writeTable(in, e, b.cacheHint(full && len(staged) == 0, len(e.write)+len(e.gone)))
	}
	return in
}

// tableEdit is what one table's block changes, as data.
type tableEdit struct {
	table Table
	write []*Chain // chains declared (so flushed) and rewritten
	gone  []string // kp's chains nobody wants any more, sorted
	jumps []jump   // jumps from built-in chains the kernel lacks (full syncs)
	extra []string // "-D" lines of duplicated jumps (full syncs)
}

func (e *tableEdit) size() int { return len(e.write) + len(e.gone) + len(e.jumps) + len(e.extra) }

// planTable decides table t's block: the chains of want whose digest
// differs from what kp wrote (every one on a full sync; staged chains are
// in the kernel already), recording their new digests in written; kp's
// chains not wanted (on a full sync, those the kernel holds; else those kp
// wrote); and, on a full sync, the jumps from built-in chains to insert or
// deduplicate.
func (b *Backend) planTable(t Table, f proxy.Family, bk *book, want []*Chain, wanted map[chainKey]bool, kernel map[Table]*Dump, full bool, staged, written map[chainKey]string) tableEdit {
	e := tableEdit{table: t}
	for _, c := range want {
		if c.Table != t {
			continue
		}
		k := chainKey{t, c.Name}
		if _, ok := staged[k]; ok {
			continue
		}
		if d := c.digest(); full || bk.written[k] != d {
			e.write = append(e.write, c)
			written[k] = d
		}
	}
	if full {
		for _, name := range kernel[t].Chains {
			if isKPChain(name) && !wanted[chainKey{t, name}] {
				e.gone = append(e.gone, name)
			}
		}
	} else {
		for k := range bk.written {
			if k.table == t && !wanted[k] {
				e.gone = append(e.gone, k.name)
			}
		}
	}
	slices.Sort(e.gone)
	if full {
		for _, j := range b.jumps(f) {
			if j.table != t {
				continue
			}
			found := jumpRules(kernel[t], j)
			if len(found) == 0 {
				e.jumps = append(e.jumps, j)
			}
			for _, r := range found[min(1, len(found)):] {
				e.extra = append(e.extra, "-D "+j.from+" "+r.Spec)
			}
		}
		for _, j := range retiredJumps {
			if j.table != t {
				continue
			}
			for _, r := range jumpRules(kernel[t], j) {
				e.extra = append(e.extra, "-D "+j.from+" "+r.Spec)
			}
		}
	}
	return e
}

// writeTable writes e's block: the chain lines of the jumps' targets, the
// jumps from built-in chains and the deletions of duplicates, the cache
// hint when hint is set, the other chain lines (those of deleted chains
// flush them), the rules, then the deletions (a chain is deleted only after
// every rule naming it was flushed or rewritten).
func (b *Backend) writeTable(in *input, e tableEdit, hint bool) {
	t := e.table
	none := proxy.ServicePortName{}
	in.line("*"+string(t), none, "")
	// The jumps from built-in chains come first, after their targets'
	// chain lines: iptables-nft creates a missing built-in chain only
	// for a rule sent before the cache hint below.
	targets := map[string]bool{}
	for _, j := range e.jumps {
		targets[j.to] = true
	}
	for _, c := range e.write {
		if targets[c.Name] {
			in.line(":"+c.Name+" - [0:0]", ownerOf(c), c.Name)
		}
	}
	for _, j := range e.jumps {
		in.line(j.line(), none, j.from)
	}
	for _, l := range e.extra {
		in.line(l, none, strings.Fields(l)[1])
	}
	if hint {
		in.line(cacheHintLine, none, "")
		in.hinted = true
	}
	for _, c := range e.write {
		if !targets[c.Name] {
			in.line(":"+c.Name+" - [0:0]", ownerOf(c), c.Name)
		}
	}
	for _, name := range e.gone {
		in.line(":"+name+" - [0:0]", none, name)
		delete(in.written, chainKey{t, name})
	}
	for _, c := range e.write {
		for _, r := range c.Rules {
			in.line(r.line(c.Name), r.Owner, c.Name)
		}
		in.rules[t] += len(c.Rules)
	}
	for _, name := range e.gone {
		in.line("-X "+name, none, name)
	}
	in.line("COMMIT", none, "")
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
