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
		for _, t := range []Table{TableNAT, TableFilter} {
			data, err := b.runner(f).Save(ctx, t, true)
			if err != nil {
				return out, fmt.Errorf("list %s %s %s: %w", b.Flavor(), f, t, err)
			}
			out = append(out, proxy.RuleListing{Where: fmt.Sprintf("iptables-%s %s %s", b.Flavor(), f, t),
				Format: "iptables-save", Text: kpLines(data)})
		}
	}
	return out, nil
}

// kpLines keeps what of an iptables-save table is kp's: the table line,
// KP- chains' declarations and rules, rules jumping to a KP- chain, COMMIT.
func kpLines(data []byte) string {
	var sb strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		keep := strings.HasPrefix(line, "*") || line == "COMMIT" || strings.HasPrefix(line, ":"+ownChainPrefix) ||
			strings.Contains(line, "-A "+ownChainPrefix) || strings.Contains(line, "-j "+ownChainPrefix)
		if keep {
			sb.WriteString(line)
			sb.WriteByte('\n')
		}
	}
	return sb.String()
}
