package migrate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/nftables"

	"github.com/kpproxy/kp/legacy/iptables"
	"github.com/kpproxy/kp/proxy"
)

// kubeProxyChains are the chains upstream kube-proxy (v1.36) creates in its
// iptables and ipvs modes, besides its per-service chains
// (kubeProxyChainPrefixes). kubelet's own chains (KUBE-FIREWALL,
// KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT, KUBE-MARK-DROP) are not here:
// they are not kube-proxy's to remove.
var kubeProxyChains = map[string]bool{
	"KUBE-SERVICES": true, "KUBE-EXTERNAL-SERVICES": true, "KUBE-NODEPORTS": true, "KUBE-POSTROUTING": true,
	"KUBE-MARK-MASQ": true, "KUBE-FORWARD": true, "KUBE-PROXY-FIREWALL": true, "KUBE-PROXY-CANARY": true,
	// ipvs mode
	"KUBE-NODE-PORT": true, "KUBE-LOAD-BALANCER": true, "KUBE-SOURCE-RANGES-FIREWALL": true,
	"KUBE-IPVS-FILTER": true, "KUBE-IPVS-OUT-FILTER": true,
}

// kubeProxyChainPrefixes name kube-proxy's per-service chains (iptables mode).
var kubeProxyChainPrefixes = []string{"KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-", "KUBE-XLB-"}

// kubeProxyJumpComments are the comments of kube-proxy's jumps from chains
// that are not its own (the built-in ones) into its chains: such a jump is
// kube-proxy's and goes; any other rule that jumps into its chains belongs
// to someone else and keeps the chain it names.
var kubeProxyJumpComments = []string{
	"kubernetes service portals", "kubernetes externally-visible service portals",
	"kubernetes health check service ports", "kubernetes forwarding rules", "kubernetes load balancer firewall",
	"kubernetes postrouting rules", "kubernetes health check rules", "kube-proxy firewall rules",
	"kubernetes ipvs access filter",
}

func isKubeProxyChain(name string) bool {
	return kubeProxyChains[name] || slices.ContainsFunc(kubeProxyChainPrefixes, func(p string) bool { return strings.HasPrefix(name, p) })
}

// ownedRules is a plan for one table: the jump rules to delete (chain and
// saved spec) and the chains to flush and delete; kept are the chains of
// kube-proxy that another program's rule still jumps into.
type ownedRules struct {
	table  iptables.Table
	jumps  [][2]string
	chains []string
	kept   []string
}

func (o ownedRules) empty() bool { return len(o.jumps) == 0 && len(o.chains) == 0 }

// planTable finds kube-proxy's rules in one saved table.
func planTable(d *iptables.Dump) ownedRules {
	plan := ownedRules{table: d.Table}
	// Jumps into kube-proxy's chains from chains that are not its own:
	// kube-proxy's when they carry one of its comments, else foreign.
	keep := map[string]bool{}
	for _, chain := range d.Chains {
		if isKubeProxyChain(chain) {
			continue
		}
		for _, r := range d.Rules[chain] {
			target := iptables.RuleTarget(r.Spec)
			if !isKubeProxyChain(target) {
				continue
			}
			if slices.ContainsFunc(kubeProxyJumpComments, func(c string) bool { return strings.Contains(r.Spec, c) }) {
				plan.jumps = append(plan.jumps, [2]string{chain, r.Spec})
			} else {
				keep[target] = true
			}
		}
	}
	// A kept chain keeps what it jumps to: flushing those would change
	// what the foreign rule's packets meet.
	for changed := true; changed; {
		changed = false
		for chain := range keep {
			for _, r := range d.Rules[chain] {
				if t := iptables.RuleTarget(r.Spec); isKubeProxyChain(t) && !keep[t] {
					keep[t], changed = true, true
				}
			}
		}
	}
	for _, chain := range d.Chains {
		switch {
		case !isKubeProxyChain(chain):
		case keep[chain]:
			plan.kept = append(plan.kept, chain)
		default:
			plan.chains = append(plan.chains, chain)
		}
	}
	return plan
}

// input is the plan as one iptables-restore --noflush input: one kernel
// transaction per table.
func (o ownedRules) input() []byte {
	var b strings.Builder
	b.WriteString("*" + string(o.table) + "\n")
	for _, j := range o.jumps {
		b.WriteString("-D " + j[0] + " " + j[1] + "\n")
	}
	for _, c := range o.chains {
		b.WriteString("-F " + c + "\n")
	}
	for _, c := range o.chains {
		b.WriteString("-X " + c + "\n")
	}
	b.WriteString("COMMIT\n")
	return []byte(b.String())
}

// IPTablesFound is what kube-proxy left in one iptables flavor and family.
type IPTablesFound struct {
	Flavor iptables.Flavor
	Family proxy.Family
	Chains int // kube-proxy's chains (removed, when removing)
	Jumps  int // its jump rules in other chains
	// Kept names the chains of kube-proxy's left because another program's
	// rule jumps into them.
	Kept []string
	// Skipped says why this flavor and family were not looked at: absent
	// from the node (iptables.Absent). One that could not be read is an
	// error instead.
	Skipped string
}

func (f IPTablesFound) String() string {
	s := fmt.Sprintf("iptables-%s/%s: ", f.Flavor, f.Family)
	if f.Skipped != "" {
		return s + "skipped (" + f.Skipped + ")"
	}
	s += fmt.Sprintf("%d chains, %d jump rules", f.Chains, f.Jumps)
	if len(f.Kept) > 0 {
		s += fmt.Sprintf(", kept %s (another rule jumps there)", strings.Join(f.Kept, " "))
	}
	return s
}

// KubeProxyIPTables finds kube-proxy's iptables and ipvs-mode chains in
// both flavors and families of the calling thread's network namespace and,
// when remove is set, removes them: kube-proxy's jump rules (by their
// comments), then its chains, one iptables-restore per table, as upstream's
// own cleanup does but never breaking another program's rule.
func KubeProxyIPTables(ctx context.Context, remove bool) ([]IPTablesFound, error) {
	var out []IPTablesFound
	var errs []error
	for _, fl := range []iptables.Flavor{iptables.FlavorNFT, iptables.FlavorLegacy} {
		for _, fam := range []proxy.Family{proxy.IPv4, proxy.IPv6} {
			found := IPTablesFound{Flavor: fl, Family: fam}
			if fl == iptables.FlavorNFT {
				if has, err := hasKubeProxyChainsNFT(fam); err == nil && !has {
					out = append(out, found)
					continue
				}
			}
			save, err := iptables.SaveAll(ctx, fl, fam)
			if iptables.Absent(err) {
				found.Skipped = err.Error()
				out = append(out, found)
				continue
			}
			if err != nil {
				// Unread is not empty: kube-proxy's rules may be there,
				// and would stay, stale, if this passed as done.
				errs = append(errs, fmt.Errorf("find kube-proxy's rules: %w", err))
				continue
			}
			// kp's own chains never jump into kube-proxy's: their rules
			// (440,000 at 10,000 Services) are not read.
			dumps, err := iptables.ParseSaveOthers(save)
			if err != nil {
				errs = append(errs, fmt.Errorf("read iptables-%s %s: %w", fl, fam, err))
				continue
			}
			r := iptables.NewRunner(fl, fam)
			for _, t := range []iptables.Table{iptables.TableNAT, iptables.TableFilter, iptables.TableMangle} {
				d := dumps[t]
				if d == nil {
					continue
				}
				plan := planTable(d)
				found.Chains += len(plan.chains)
				found.Jumps += len(plan.jumps)
				found.Kept = append(found.Kept, plan.kept...)
				if !remove || plan.empty() {
					continue
				}
				if err := r.Restore(ctx, plan.input()); err != nil {
					errs = append(errs, fmt.Errorf("remove kube-proxy's %s chains (iptables-%s %s): %w", t, fl, fam, err))
				}
			}
			out = append(out, found)
		}
	}
	return out, errors.Join(errs...)
}

// hasKubeProxyChainsNFT reports whether iptables-nft's tables of family f
// hold a chain of kube-proxy's, from a netlink listing of chain names
// alone. Without one there is nothing to remove (its jumps lead into its
// chains), and the node's ruleset need not be saved and read: at 10,000
// Services kp's own iptables mode has 110,000 chains, and
// iptables-nft-save of them took 280 MiB and seconds.
func hasKubeProxyChainsNFT(f proxy.Family) (bool, error) {
	conn, err := nftables.New()
	if err != nil {
		return false, err
	}
	defer conn.CloseLasting()
	nf := nftables.TableFamilyIPv4
	if f == proxy.IPv6 {
		nf = nftables.TableFamilyIPv6
	}
	chains, err := conn.ListChainsOfTableFamily(nf)
	if err != nil {
		return false, err
	}
	for _, c := range chains {
		switch iptables.Table(c.Table.Name) {
		case iptables.TableNAT, iptables.TableFilter, iptables.TableMangle:
			if isKubeProxyChain(c.Name) {
				return true, nil
			}
		}
	}
	return false, nil
}
