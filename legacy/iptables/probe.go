package iptables

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/kpproxy/kp/proxy"
)

// probeRule is one feature kp's iptables mode needs, as a rule that uses it.
type probeRule struct {
	feature string
	table   Table
	// spec follows "-A KP-PROBE-<pid> "; {chain} is the chain's name
	// (recent's list is named after it), {dest} a DNAT destination of the
	// family.
	spec string
}

// probeRules are the kernel features the iptables renderer's rules use, in
// the tables they use them in. A feature missing from the kernel (a module
// not built, xt_recent blacklisted, a container without nat) fails here
// and not in the middle of the first sync.
var probeRules = []probeRule{
	{"the comment match", TableNAT, `-m comment --comment "kp probe"`},
	{"protocol tcp", TableNAT, "-p tcp -m tcp --dport 1"},
	{"protocol udp", TableNAT, "-p udp -m udp --dport 1"},
	{"protocol sctp", TableNAT, "-p sctp -m sctp --dport 1"},
	{"the multiport match", TableNAT, "-p tcp -m multiport --dports 1,2"},
	{"the addrtype match", TableNAT, "-m addrtype --dst-type LOCAL"},
	{"the mark match", TableNAT, "-m mark --mark 0x4000/0x4000"},
	{"the conntrack match (--ctstate)", TableNAT, "-m conntrack --ctstate NEW"},
	{"the statistic match (--mode random)", TableNAT, "-m statistic --mode random --probability 0.50000000000"},
	{"the recent match (--set)", TableNAT, "-m recent --name {chain} --set --rsource"},
	{"the recent match (--rcheck --seconds --reap)", TableNAT, "-m recent --name {chain} --rcheck --seconds 10800 --reap --rsource"},
	{"the MARK target (--or-mark)", TableNAT, "-j MARK --or-mark 0x4000"},
	{"the DNAT target", TableNAT, "-p tcp -j DNAT --to-destination {dest}"},
	{"the MASQUERADE target", TableNAT, "-j MASQUERADE"},
	{"the conntrack match in filter", TableFilter, "-m conntrack --ctstate INVALID -j DROP"},
	{"the REJECT target", TableFilter, "-j REJECT"},
}

// ProbeError is a flavor and family that cannot run kp's iptables mode:
// the kernel refused Feature (or the nat table, when Feature says so).
type ProbeError struct {
	Flavor  Flavor
	Family  proxy.Family
	Feature string
	Err     error
}

func (e *ProbeError) Error() string {
	return fmt.Sprintf("iptables-%s (%s) cannot run kp's iptables mode: the kernel refused %s: %v", e.Flavor, e.Family, e.Feature, e.Err)
}

func (e *ProbeError) Unwrap() error { return e.Err }

// Probe checks that this node (the calling thread's network namespace) can
// run kp's iptables mode with flavor fl for family f: the binaries exist,
// and the kernel accepts every rule feature kp uses, in a throwaway chain
// KP-PROBE-<pid> of nat and filter that is deleted again. The error names
// the first feature the kernel refused, or the package to install.
func Probe(ctx context.Context, fl Flavor, f proxy.Family) error {
	for _, bin := range []string{restoreBinary(fl, f), saveBinary(fl, f)} {
		if _, err := lookBinary(bin); err != nil {
			return err
		}
	}
	return probe(ctx, NewRunner(fl, f), fmt.Sprintf("KP-PROBE-%d", os.Getpid()), probeRules)
}

// probe tries rules in chain through r, in one restore; when the kernel
// refuses a table's block without naming the rule, rule by rule.
func probe(ctx context.Context, r Runner, chain string, rules []probeRule) error {
	feature, err := tryProbe(ctx, r, chain, rules)
	if err == nil {
		return nil
	}
	if feature == "" {
		// iptables-legacy names the COMMIT line when the kernel refuses a
		// table at commit (a module missing from the kernel); iptables-nft
		// names the rule. Find the rule by trying them one at a time.
		for _, p := range rules {
			if f, e := tryProbe(ctx, r, chain, []probeRule{p}); e != nil {
				if f == "" {
					f = p.feature
				}
				return &ProbeError{Flavor: r.Flavor(), Family: r.Family(), Feature: f, Err: e}
			}
		}
		var re *RestoreError
		if !errors.As(err, &re) {
			return fmt.Errorf("probe iptables-%s (%s): %w", r.Flavor(), r.Family(), err)
		}
		feature = "the features together, though each alone passes"
	}
	return &ProbeError{Flavor: r.Flavor(), Family: r.Family(), Feature: feature, Err: err}
}

// tryProbe restores rules in chain and removes the chain again. On a
// refusal, feature is the one of the line iptables-restore named, "" when
// it named none or a COMMIT.
func tryProbe(ctx context.Context, r Runner, chain string, rules []probeRule) (feature string, err error) {
	input, features := probeInput(chain, r.Family(), rules)
	err = r.Restore(ctx, input)
	var re *RestoreError
	if errors.As(err, &re) && re.Line > 0 && re.Line <= len(features) && re.Text != "COMMIT" {
		feature = features[re.Line-1]
	}
	if derr := removeProbeChain(ctx, r, chain); derr != nil {
		err = errors.Join(err, fmt.Errorf("remove probe chain %s: %w", chain, derr))
	}
	return feature, err
}

// probeInput is the restore input that declares chain in the tables of rules
// and fills it with them, and for each input line (0-based) the feature
// it probes.
func probeInput(chain string, f proxy.Family, rules []probeRule) ([]byte, []string) {
	dest := "192.0.2.1:80"
	if f == proxy.IPv6 {
		dest = "[2001:db8::1]:80"
	}
	fill := strings.NewReplacer("{chain}", chain, "{dest}", dest)
	var b strings.Builder
	var features []string
	line := func(feature, s string) {
		b.WriteString(s + "\n")
		features = append(features, feature)
	}
	for _, t := range []Table{TableNAT, TableFilter} {
		if !slices.ContainsFunc(rules, func(p probeRule) bool { return p.table == t }) {
			continue
		}
		line("the "+string(t)+" table", "*"+string(t))
		line("the "+string(t)+" table", ":"+chain+" - [0:0]")
		for _, p := range rules {
			if p.table == t {
				line(p.feature, "-A "+chain+" "+fill.Replace(p.spec))
			}
		}
		line("the "+string(t)+" table", "COMMIT")
	}
	return []byte(b.String()), features
}

// removeProbeChain deletes chain from every table that has it. The probe
// may have failed in any table, and iptables-restore applies each table's
// block on its own, so each table is looked at.
func removeProbeChain(ctx context.Context, r Runner, chain string) error {
	var errs []error
	for _, t := range []Table{TableNAT, TableFilter} {
		out, err := r.Save(ctx, t, false)
		if err != nil {
			// A table the kernel lacks holds no probe chain.
			continue
		}
		if !strings.Contains(string(out), "\n:"+chain+" ") {
			continue
		}
		in := fmt.Sprintf("*%s\n-F %s\n-X %s\nCOMMIT\n", t, chain, chain)
		if err := r.Restore(ctx, []byte(in)); err != nil {
			errs = append(errs, fmt.Errorf("table %s: %w", t, err))
		}
	}
	return errors.Join(errs...)
}
