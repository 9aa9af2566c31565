package nft

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"

	"github.com/kpproxy/kp/proxy"
)

// ListRules implements proxy.RuleLister: kp's tables as `nft -a list
// table` prints them (with rule handles, which a trace names), through
// the nft CLI, which kp does not otherwise need. Without it (kp's image
// has none), or for a backend built for another network namespace
// (NewInNamespace: the CLI would run in the caller's), the tables are read
// through netlink: chains and rule handles, each rule as kp describes it
// (ListingFormatNetlink).
func (b *Backend) ListRules(ctx context.Context) ([]proxy.RuleListing, error) {
	path, err := exec.LookPath("nft")
	if err != nil || b.probeNsFd > 0 {
		l, ok := b.conn.(ruleLister)
		switch {
		case ok:
			return b.listRulesNetlink(l)
		case b.probeNsFd > 0:
			return nil, errors.New("nftables mode: listing a table of another network namespace is not supported")
		}
		return nil, fmt.Errorf("nftables mode: the nft CLI is not installed, so kp's tables are not listed: %w", err)
	}
	var out []proxy.RuleListing
	for _, fam := range []string{"ip", "ip6"} {
		var stdout, stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, path, "-a", "list", "table", fam, TableName)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			if strings.Contains(stderr.String(), "No such file or directory") {
				continue // kp programs no table of this family here
			}
			return out, fmt.Errorf("nft list table %s %s: %w: %s", fam, TableName, err, strings.TrimSpace(stderr.String()))
		}
		out = append(out, proxy.RuleListing{Where: "nftables " + fam + " " + TableName, Format: "nft", Text: stdout.String()})
	}
	return out, nil
}
