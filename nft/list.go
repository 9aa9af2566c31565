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
// the nft CLI, which kp does not otherwise need: without it, an error
// says so. The CLI runs in the caller's network namespace, so a backend
// built for another one (NewInNamespace) does not list.
func (b *Backend) ListRules(ctx context.Context) ([]proxy.RuleListing, error) {
	if b.probeNsFd > 0 {
		return nil, errors.New("nftables mode: listing a table of another network namespace is not supported")
	}
	path, err := exec.LookPath("nft")
	if err != nil {
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
