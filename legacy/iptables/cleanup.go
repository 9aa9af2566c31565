package iptables

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"slices"
	"strings"

	goipt "github.com/coreos/go-iptables/iptables"

	"github.com/kpproxy/kp/proxy"
)

// cleanupTables are the tables kp's iptables mode writes to.
var cleanupTables = []Table{TableNAT, TableFilter, TableMangle}

// Removed is what Cleanup removed, per flavor and family.
type Removed []RemovedCount

// RemovedCount is what Cleanup removed from one flavor and family, or why
// it skipped them.
type RemovedCount struct {
	Flavor Flavor
	Family proxy.Family
	Chains int // KP- chains flushed and deleted
	Rules  int // rules outside KP- chains that jumped to one
	// Skipped says why the flavor and family were not looked at (binaries
	// missing, the kernel lacking it), "" when they were.
	Skipped string
}

// String is one log line: "nft/IPv4: 12 chains, 3 jump rules; ...".
func (r Removed) String() string {
	parts := make([]string, 0, len(r))
	for _, c := range r {
		p := fmt.Sprintf("%s/%s: ", c.Flavor, c.Family)
		if c.Skipped != "" {
			p += "skipped (" + c.Skipped + ")"
		} else {
			p += fmt.Sprintf("%d chains, %d jump rules", c.Chains, c.Rules)
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}

// Total is the number of chains and rules removed in all flavors and
// families.
func (r Removed) Total() (chains, rules int) {
	for _, c := range r {
		chains += c.Chains
		rules += c.Rules
	}
	return chains, rules
}

// Cleanup removes everything kp's iptables mode wrote, in both flavors and
// both families of the calling thread's network namespace: every rule of
// nat, filter and mangle that jumps (-j or -g) to a KP- chain, then every
// KP- chain. Nothing else is touched: other chains, and rules that only
// mention kp in a comment, stay. A flavor or family whose binaries are
// missing, or whose kernel part is absent, is skipped with a log line; the
// error collects what failed in the others.
//
// It lists chains and deletes the jump rules with go-iptables, which runs
// the iptables binary itself (only that one: it never runs the -save or
// -restore siblings), pointed at iptables-nft or iptables-legacy by its Path
// option; the KP- chains go in one iptables-restore per table. It first reads the
// flavor's iptables-save output to learn which tables exist: asking
// iptables-legacy about a table the kernel has not loaded would create it.
//
// The chains of the other modes that write through WriteOwned (the
// userspace mode's KP-USERSPACE-) are theirs: CleanupOwned removes them.
func Cleanup(ctx context.Context, log *slog.Logger) (Removed, error) {
	return CleanupChains(ctx, log, "iptables", isKPChain)
}

// CleanupChains is Cleanup for the chains owns accepts (the ipvs mode's
// KP-IPVS- chains): their jump rules, then the chains. what names the
// owner in the log line.
func CleanupChains(ctx context.Context, log *slog.Logger, what string, owns func(chain string) bool) (Removed, error) {
	removed, err := cleanupAll(ctx, log, owns)
	log.Info("removed kp's "+what+" mode's iptables rules", "removed", removed.String())
	return removed, err
}

// cleanupAll removes the chains owns says are to go, and the jumps to
// them, in both flavors and families.
func cleanupAll(ctx context.Context, log *slog.Logger, owns func(chain string) bool) (Removed, error) {
	var removed Removed
	var errs []error
	for _, fl := range []Flavor{FlavorNFT, FlavorLegacy} {
		for _, f := range []proxy.Family{proxy.IPv4, proxy.IPv6} {
			c, err := cleanupOne(ctx, log, fl, f, owns)
			if err != nil {
				errs = append(errs, err)
			}
			removed = append(removed, c)
		}
	}
	return removed, errors.Join(errs...)
}

func cleanupOne(ctx context.Context, log *slog.Logger, fl Flavor, f proxy.Family, owns func(string) bool) (RemovedCount, error) {
	c := RemovedCount{Flavor: fl, Family: f}
	bin := strings.TrimSuffix(saveBinary(fl, f), "-save")
	skip := func(why string) (RemovedCount, error) {
		c.Skipped = why
		log.Info("iptables cleanup: skipping a backend", "flavor", fl, "family", f, "reason", why)
		return c, nil
	}
	if _, err := exec.LookPath(bin); err != nil {
		return skip((&MissingBinaryError{Binary: bin}).Error())
	}
	save, err := SaveAll(ctx, fl, f)
	if err != nil && Absent(err) {
		return skip(err.Error())
	}
	if err != nil {
		// Unread is not clean: kp's chains may be there.
		return c, fmt.Errorf("iptables cleanup: %w", err)
	}
	dumps, err := ParseSave(save)
	if err != nil {
		return c, fmt.Errorf("iptables cleanup %s: %w", bin, err)
	}
	if len(dumps) == 0 {
		return c, nil // no table: nothing of kp's, and no iptables to run
	}
	proto := goipt.ProtocolIPv4
	if f == proxy.IPv6 {
		proto = goipt.ProtocolIPv6
	}
	ipt, err := goipt.New(goipt.IPFamily(proto), goipt.Path(bin))
	if err != nil {
		return skip(fmt.Sprintf("%s does not run: %v", bin, err))
	}
	var errs []error
	for _, t := range cleanupTables {
		if dumps[t] == nil {
			continue // the kernel has no such table here: nothing of kp's in it
		}
		chains, rules, err := cleanupTable(ctx, ipt, NewRunner(fl, f), dumps[t], owns)
		c.Chains += chains
		c.Rules += rules
		if err != nil {
			errs = append(errs, fmt.Errorf("iptables cleanup %s table %s: %w", bin, t, err))
		}
	}
	return c, errors.Join(errs...)
}

// cleanupTable removes kp's jump rules and chains from one table. saved,
// the table's iptables-save, picks the chains worth listing: running
// iptables once per chain of a large ruleset (kube-proxy's thousands of
// KUBE- chains) would take minutes.
func cleanupTable(ctx context.Context, ipt *goipt.IPTables, r Runner, saved *Dump, owns func(string) bool) (chains, rules int, err error) {
	table := saved.Table
	all, err := ipt.ListChains(string(table))
	if err != nil {
		return 0, 0, fmt.Errorf("list chains: %w", err)
	}
	var own []string
	var errs []error
	for _, chain := range all {
		if owns(chain) {
			own = append(own, chain)
			continue
		}
		if !slices.ContainsFunc(saved.Rules[chain], func(r SavedRule) bool {
			_, ok := jumpRuleArgs("-A "+chain+" "+r.Spec, chain, owns)
			return ok
		}) {
			continue
		}
		specs, err := ipt.List(string(table), chain)
		if err != nil {
			errs = append(errs, fmt.Errorf("list chain %s: %w", chain, err))
			continue
		}
		for _, spec := range specs {
			if err := ctx.Err(); err != nil {
				return chains, rules, err
			}
			args, ok := jumpRuleArgs(spec, chain, owns)
			if !ok {
				continue
			}
			if err := ipt.Delete(string(table), chain, args...); err != nil {
				errs = append(errs, fmt.Errorf("delete rule %q: %w", spec, err))
				continue
			}
			rules++
		}
	}
	if len(own) > 0 {
		if err := removeChains(ctx, r, table, own); err != nil {
			errs = append(errs, err)
		} else {
			chains = len(own)
		}
	}
	return chains, rules, errors.Join(errs...)
}

// removeChains flushes and deletes chains in one iptables-restore: one
// kernel transaction for the table, where go-iptables would run iptables
// twice per chain, and iptables-nft reads the whole ruleset on every run
// (minutes for the tens of thousands of chains of a large cluster). Every
// chain is flushed before any is deleted: a chain can only be deleted once
// nothing jumps to it.
func removeChains(ctx context.Context, r Runner, table Table, chains []string) error {
	var b strings.Builder
	b.WriteString("*" + string(table) + "\n")
	for _, c := range chains {
		b.WriteString("-F " + c + "\n")
	}
	for _, c := range chains {
		b.WriteString("-X " + c + "\n")
	}
	b.WriteString("COMMIT\n")
	if err := r.Restore(ctx, []byte(b.String())); err != nil {
		return fmt.Errorf("delete %d KP- chains: %w", len(chains), err)
	}
	return nil
}

// jumpRuleArgs returns the arguments that delete spec, a line of
// "iptables -S chain", when the rule jumps or goes to a chain owns says is
// to go.
func jumpRuleArgs(spec, chain string, owns func(string) bool) ([]string, bool) {
	args, err := splitRuleSpec(spec)
	if err != nil || len(args) < 2 || args[0] != "-A" || args[1] != chain {
		return nil, false
	}
	args = args[2:]
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "-j", "--jump", "-g", "--goto":
			if owns(args[i+1]) {
				return args, true
			}
		}
	}
	return nil, false
}

// splitRuleSpec splits a rule as iptables prints it (-S, iptables-save)
// into arguments: double quotes group, and a backslash escapes the next
// character (iptables prints a comment's " as \" and its ' as \').
func splitRuleSpec(s string) ([]string, error) {
	var args []string
	var cur strings.Builder
	inArg, quoted := false, false
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case ch == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
			inArg = true
		case ch == '"':
			quoted = !quoted
			inArg = true
		case ch == ' ' && !quoted:
			if inArg {
				args = append(args, cur.String())
				cur.Reset()
				inArg = false
			}
		default:
			cur.WriteByte(ch)
			inArg = true
		}
	}
	if quoted {
		return nil, fmt.Errorf("unterminated quote in %q", s)
	}
	if inArg {
		args = append(args, cur.String())
	}
	return args, nil
}
