package migrate

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/google/nftables"

	"github.com/kpproxy/kp/legacy/iptables"
	"github.com/kpproxy/kp/proxy"
)

// Found is one place where a proxy programs this node's Services: a
// table of nftables, or one iptables flavor and family, with its size.
type Found struct {
	Owner string // "kp" or "kube-proxy"
	// Mode is the owner's mode these rules belong to: for kp nftables,
	// iptables-nft, iptables-legacy, userspace; for kube-proxy nftables or
	// iptables/ipvs (its iptables chains serve both of its modes).
	Mode  string
	Where string // "nftables ip kp", "iptables-legacy IPv6"
	// Chains, Rules, Elements (of named sets and maps) and VirtualServers
	// (IPVS) are counted; Rules in iptables include the jumps to the
	// owner's chains from built-in ones.
	Chains, Rules, Elements, VirtualServers int
}

// Size is the counts as one phrase: "3 chains, 12 rules, 40 set elements".
func (f Found) Size() string {
	var parts []string
	for _, c := range []struct {
		n    int
		what string
	}{{f.Chains, "chains"}, {f.Rules, "rules"}, {f.Elements, "set elements"}, {f.VirtualServers, "virtual servers"}} {
		if c.n > 0 || c.what == "chains" {
			parts = append(parts, fmt.Sprintf("%d %s", c.n, c.what))
		}
	}
	return strings.Join(parts, ", ")
}

// Is reports whether f is kp's rules of target t.
func (f Found) Is(owner string, t proxy.Target) bool {
	if f.Owner != owner {
		return false
	}
	if t.Mode == proxy.ModeIPTables && t.IPTablesBackend == "" {
		return strings.HasPrefix(f.Mode, "iptables")
	}
	return f.Mode == t.String()
}

// nftOwners maps the nftables tables this package knows to owner and mode.
var nftOwners = map[string][2]string{
	"kp":              {"kp", "nftables"},
	"kp-userspace":    {"kp", "userspace"},
	kubeProxyNFTTable: {"kube-proxy", "nftables"},
}

// Inventory lists what programs Services in the calling thread's network
// namespace: kp's tables and chains in each of its modes, and upstream
// kube-proxy's, with their sizes. It changes nothing. A flavor of iptables
// whose binaries or kernel part are missing is left out; one that is there
// but cannot be read (iptables-legacy without CAP_NET_RAW) is an error
// naming why, beside what could be read: never an empty listing.
func Inventory(ctx context.Context) ([]Found, error) {
	found, err := inventoryNFTables()
	if err != nil {
		return found, err
	}
	var errs []error
	for _, fl := range []iptables.Flavor{iptables.FlavorNFT, iptables.FlavorLegacy} {
		for _, fam := range []proxy.Family{proxy.IPv4, proxy.IPv6} {
			save, err := iptables.SaveAll(ctx, fl, fam)
			if iptables.Absent(err) {
				continue // missing binaries or kernel part: nothing there to count
			}
			if err != nil {
				// Unread is not empty: kube-proxy's rules may be there.
				errs = append(errs, err)
				continue
			}
			dumps, err := iptables.ParseSave(save)
			if err != nil {
				return found, fmt.Errorf("read iptables-%s %s: %w", fl, fam, err)
			}
			found = append(found, inventoryIPTables(dumps, fl, fam)...)
		}
	}
	// NodePort virtual servers are counted when the take-over removes
	// them (it knows the NodePorts); the plan counts those on kube-ipvs0.
	if v, err := KubeProxyIPVS(ctx, FindOnly, nil); err == nil && !v.empty() {
		f := Found{Owner: "kube-proxy", Mode: "ipvs", Where: "ipvs", VirtualServers: v.VirtualServers, Elements: 0}
		if v.Interface {
			f.Where = "ipvs, interface " + kubeIPVSInterface
		}
		if len(v.IPSets) > 0 {
			f.Where += fmt.Sprintf(", %d ipsets", len(v.IPSets))
		}
		found = append(found, f)
	}
	return found, errors.Join(errs...)
}

// inventoryIPTables counts kp's KP- chains, by the mode that writes them
// (kpIPTablesMode), and kube-proxy's chains in one flavor and family's
// tables.
func inventoryIPTables(dumps map[iptables.Table]*iptables.Dump, fl iptables.Flavor, fam proxy.Family) []Found {
	where := fmt.Sprintf("iptables-%s %s", fl, fam)
	kp := map[string]*Found{}
	kpOf := func(chain string) *Found {
		mode := kpIPTablesMode(chain, fl)
		if kp[mode] == nil {
			kp[mode] = &Found{Owner: "kp", Mode: mode, Where: where}
		}
		return kp[mode]
	}
	kube := Found{Owner: "kube-proxy", Mode: "iptables/ipvs", Where: where}
	for _, t := range []iptables.Table{iptables.TableNAT, iptables.TableFilter, iptables.TableMangle} {
		d := dumps[t]
		if d == nil {
			continue
		}
		for _, chain := range d.Chains {
			if strings.HasPrefix(chain, "KP-") {
				f := kpOf(chain)
				f.Chains++
				f.Rules += len(d.Rules[chain])
				continue
			}
			for _, r := range d.Rules[chain] {
				if to := iptables.RuleTarget(r.Spec); strings.HasPrefix(to, "KP-") && !isKubeProxyChain(chain) {
					kpOf(to).Rules++
				}
			}
		}
		plan := planTable(d)
		kube.Chains += len(plan.chains)
		kube.Rules += len(plan.jumps)
		for _, c := range plan.chains {
			kube.Rules += len(d.Rules[c])
		}
	}
	var out []Found
	for _, m := range slices.Sorted(maps.Keys(kp)) {
		out = append(out, *kp[m])
	}
	if kube.Chains > 0 || kube.Rules > 0 {
		out = append(out, kube)
	}
	return out
}

// kpIPTablesMode is the mode that writes kp's iptables chain: the
// userspace mode's redirects (KP-USERSPACE-) and the ipvs mode's chains
// (KP-IPVS-) are theirs, the other KP- chains the iptables mode's in
// flavor fl.
func kpIPTablesMode(chain string, fl iptables.Flavor) string {
	switch {
	case strings.HasPrefix(chain, iptables.UserspaceChainPrefix):
		return string(proxy.ModeUserspace)
	case strings.HasPrefix(chain, iptables.IPVSChainPrefix):
		return string(proxy.ModeIPVS)
	}
	return "iptables-" + string(fl)
}

func inventoryNFTables() ([]Found, error) {
	conn, tables, err := listIPNFTables()
	if err != nil {
		return nil, err
	}
	defer conn.CloseLasting()
	var out []Found
	for _, t := range tables {
		owner, ok := nftOwners[t.Name]
		if !ok {
			continue
		}
		fam := "ip"
		if t.Family == nftables.TableFamilyIPv6 {
			fam = "ip6"
		}
		f := Found{Owner: owner[0], Mode: owner[1], Where: "nftables " + fam + " " + t.Name}
		chains, err := conn.ListChainsOfTableFamily(t.Family)
		if err != nil {
			return out, fmt.Errorf("list chains of %s: %w", f.Where, err)
		}
		for _, c := range chains {
			if c.Table.Name != t.Name {
				continue
			}
			f.Chains++
			rules, err := conn.GetRules(t, c)
			if err != nil {
				return out, fmt.Errorf("list rules of %s chain %s: %w", f.Where, c.Name, err)
			}
			f.Rules += len(rules)
		}
		sets, err := conn.GetSets(t)
		if err != nil {
			return out, fmt.Errorf("list sets of %s: %w", f.Where, err)
		}
		for _, s := range sets {
			if s.Anonymous {
				continue
			}
			els, err := conn.GetSetElements(s)
			if err != nil {
				return out, fmt.Errorf("list elements of %s set %s: %w", f.Where, s.Name, err)
			}
			f.Elements += len(els)
		}
		out = append(out, f)
	}
	return out, nil
}
