package iptables

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strings"

	"github.com/kpproxy/kp/proxy"
)

// ListRules implements proxy.RuleLister: kp's chains in the nat and filter
// tables of each family it programs, as iptables-save -c prints them:
// kp's own KP- chains, and the built-in chains' rules that jump to them.
func (b *Backend) ListRules(ctx context.Context) ([]proxy.RuleListing, error) {
	var out []proxy.RuleListing
	for _, f := range b.programmed() {
		l, err := ListOwned(ctx, b.runner(f), ownChainPrefix)
		out = append(out, l...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// ListOwned lists the chains under prefix (and the built-in chains' rules
// jumping to them) of r's family in the nat and filter tables, as
// iptables-save -c prints them: the listing of every mode that writes
// iptables chains (the iptables mode: KP-; ipvs: KP-IPVS-; userspace:
// KP-USERSPACE-).
func ListOwned(ctx context.Context, r Runner, prefix string) ([]proxy.RuleListing, error) {
	var out []proxy.RuleListing
	for _, t := range []Table{TableNAT, TableFilter} {
		data, err := r.Save(ctx, t, true)
		if err != nil {
			return out, fmt.Errorf("list %s %s %s: %w", r.Flavor(), r.Family(), t, err)
		}
		out = append(out, proxy.RuleListing{Where: ListingWhere(r.Flavor(), r.Family(), t),
			Format: "iptables-save", Text: ownedLines(data, prefix)})
	}
	return out, nil
}

// ListingWhere names the listing of one table: "iptables-nft IPv4 nat".
func ListingWhere(fl Flavor, f proxy.Family, t Table) string {
	return fmt.Sprintf("iptables-%s %s %s", fl, f, t)
}

// ownedLines keeps what of an iptables-save table is prefix's: the table
// line, the chains' declarations and rules, rules jumping to one of
// them, COMMIT.
func ownedLines(data []byte, prefix string) string {
	var sb strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		keep := strings.HasPrefix(line, "*") || line == "COMMIT" || strings.HasPrefix(line, ":"+prefix) ||
			strings.Contains(line, "-A "+prefix) || strings.Contains(line, "-j "+prefix)
		if keep {
			sb.WriteString(line)
			sb.WriteByte('\n')
		}
	}
	return sb.String()
}
