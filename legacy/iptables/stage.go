package iptables

import (
	"context"

	"github.com/kpproxy/kp/proxy"
)

// stageMaxChains bounds the chains of one staging restore: iptables-nft's
// --noflush cost grows with lines × chains named per restore
// (restore_input.go, cacheHintLine), and each restore has a fixed cost of
// its own, so 512 is the measured middle ground (test/bench/NOTES.md,
// "kp-iptables").
const stageMaxChains = 512

// staging says whether a full sync of this backend stages the chains the
// kernel does not hold ahead of its restore (WithStaging). Only for
// iptables-nft: each iptables-legacy restore replaces the whole table, so
// chunks of it would cost the table's size every time.
func (b *Backend) staging() bool { return b.Flavor() == FlavorNFT && b.stageChains > 0 }

// stage writes, ahead of a full sync's restore, every chain of want that
// the kernel does not hold, each after the chains it jumps to, in restores
// of at most b.stageChains chains, without the cache hint, and returns
// their digests: the sync's own restore then leaves them out. No chain the
// kernel holds jumps to a chain it does not hold, so no packet reaches a
// staged chain until the sync's own restore links it (the jumps from the
// built-in chains on a cold start, the rewritten chains otherwise),
// atomically with every other change: a staging restore only adds chains
// nothing jumps to yet. A sync that fails after staging leaves them so,
// and the next full sync, which reads the kernel again, writes them again
// in its own restore (or deletes them, if nobody wants them any more).
//
// Why: a cold start in one restore makes the iptables-nft-restore child
// hold the whole batch and its cache, and needs the cache hint's read of
// the whole table (sizes in test/bench/NOTES.md, "kp-iptables"); the kernel
// validates a transaction from the base chains, which staged chains are
// not reachable from, so staging costs it little.
func (b *Backend) stage(ctx context.Context, r Runner, f proxy.Family, want []*Chain, kernel map[Table]*Dump) (map[chainKey]string, map[Table]int, error) {
	staged, rules := map[chainKey]string{}, map[Table]int{}
	exists := map[chainKey]bool{}
	for t, d := range kernel {
		for _, name := range d.Chains {
			exists[chainKey{t, name}] = true
		}
	}
	var chunk []*Chain
	for _, c := range stageOrder(want, exists) {
		chunk = append(chunk, c)
		if len(chunk) < b.stageChains {
			continue
		}
		if err := stageRestore(ctx, r, f, chunk); err != nil {
			return nil, nil, err
		}
		chunk = chunk[:0]
	}
	if len(chunk) > 0 {
		if err := stageRestore(ctx, r, f, chunk); err != nil {
			return nil, nil, err
		}
	}
	for _, c := range want {
		if k := (chainKey{c.Table, c.Name}); !exists[k] {
			staged[k] = c.digest()
			rules[c.Table] += len(c.Rules)
		}
	}
	return staged, rules, nil
}

// stageOrder lists the chains of want that exists lacks, each after every
// chain of want it jumps to (a post-order of the jumps; kp's chains jump
// down a tree, from the dispatch chains to a service port's chains to its
// endpoints', never back).
func stageOrder(want []*Chain, exists map[chainKey]bool) []*Chain {
	byKey := make(map[chainKey]*Chain, len(want))
	for _, c := range want {
		byKey[chainKey{c.Table, c.Name}] = c
	}
	seen := map[chainKey]bool{}
	var out []*Chain
	var visit func(c *Chain)
	visit = func(c *Chain) {
		k := chainKey{c.Table, c.Name}
		if seen[k] || exists[k] {
			return
		}
		seen[k] = true
		for _, r := range c.Rules {
			if to := byKey[chainKey{c.Table, RuleTarget(r.Args)}]; to != nil {
				visit(to)
			}
		}
		out = append(out, c)
	}
	for _, c := range want {
		visit(c)
	}
	return out
}

// stageRestore is one staging restore of chunk, per table: its chains'
// declarations, then their rules.
func stageRestore(ctx context.Context, r Runner, f proxy.Family, chunk []*Chain) error {
	in := &input{}
	none := proxy.ServicePortName{}
	for _, t := range []Table{TableNAT, TableFilter} {
		var chains []*Chain
		for _, c := range chunk {
			if c.Table == t {
				chains = append(chains, c)
			}
		}
		if len(chains) == 0 {
			continue
		}
		in.line("*"+string(t), none, "")
		for _, c := range chains {
			in.line(":"+c.Name+" - [0:0]", ownerOf(c), c.Name)
		}
		for _, c := range chains {
			for _, r := range c.Rules {
				in.line(r.line(c.Name), r.Owner, c.Name)
			}
		}
		in.line("COMMIT", none, "")
	}
	if err := r.Restore(ctx, in.buf.Bytes()); err != nil {
		return in.explain(f, err)
	}
	return nil
}
