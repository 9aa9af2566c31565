package userspace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strings"

	"github.com/kpproxy/kp/legacy/iptables"
	"github.com/kpproxy/kp/proxy"
)

// ListingFormatListeners is the format of the listing of the proxy's
// listeners (ListRules): one line per listener, its service port (with
// " external" for the external traffic's), protocol and the addresses it
// listens on: "default/web:http TCP [::]:39017".
const ListingFormatListeners = "userspace"

// ListRules implements proxy.RuleLister: the redirect rules as their tool
// lists them (the kp-userspace tables as `nft -a list table` prints them,
// or the KP-USERSPACE- chains as iptables-save -c), then the listeners.
func (b *Backend) ListRules(ctx context.Context) ([]proxy.RuleListing, error) {
	b.mu.Lock()
	red := b.red
	listeners := b.listenerLines()
	b.mu.Unlock()
	if red == nil {
		return nil, errors.New("userspace mode: not probed yet, so the redirect method is not chosen")
	}
	var out []proxy.RuleListing
	var err error
	switch r := red.(type) {
	case nftRedirector:
		out, err = b.listNFT(ctx)
	case *iptRedirector:
		out, err = b.listIPTables(ctx, r)
	}
	out = append(out, proxy.RuleListing{Where: "userspace listeners", Format: ListingFormatListeners, Text: listeners})
	return out, err
}

// listenerLines is the listeners' listing, sorted. b.mu is held.
func (b *Backend) listenerLines() string {
	var lines []string
	for k, p := range b.proxies {
		name := k.name.String()
		if k.external {
			name += " external"
		}
		lines = append(lines, fmt.Sprintf("%s %s %s", name, p.protocol(), strings.Join(p.listenAddrs(), ",")))
	}
	slices.Sort(lines)
	if len(lines) == 0 {
		return ""
	}
	return strings.Join(lines, "\n") + "\n"
}

func (p *tcpProxy) listenAddrs() []string { return []string{p.ln.Addr().String()} }

func (p *udpProxy) listenAddrs() []string {
	out := make([]string, 0, len(p.socks))
	for _, s := range p.socks {
		out = append(out, s.LocalAddr().(*net.UDPAddr).AddrPort().String())
	}
	return out
}

// listNFT lists the kp-userspace tables with the nft CLI, run in the
// backend's namespace; without the CLI, an error says so.
func (b *Backend) listNFT(ctx context.Context) ([]proxy.RuleListing, error) {
	path, err := exec.LookPath("nft")
	if err != nil {
		return nil, fmt.Errorf("userspace mode: the nft CLI is not installed, so the kp-userspace tables are not listed: %w", err)
	}
	var out []proxy.RuleListing
	for _, f := range []proxy.Family{proxy.IPv4, proxy.IPv6} {
		fam := familyName(f)
		var stdout, stderr bytes.Buffer
		err := b.ops.inNS(func() error {
			cmd := exec.CommandContext(ctx, path, "-a", "list", "table", fam, TableName)
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			return cmd.Run()
		})
		if err != nil {
			if strings.Contains(stderr.String(), "No such file or directory") {
				continue
			}
			return out, fmt.Errorf("nft list table %s %s: %w: %s", fam, TableName, err, strings.TrimSpace(stderr.String()))
		}
		out = append(out, proxy.RuleListing{Where: "nftables " + fam + " " + TableName, Format: "nft", Text: stdout.String()})
	}
	return out, nil
}

// listIPTables lists the KP-USERSPACE- chains of each family r programs.
func (b *Backend) listIPTables(ctx context.Context, r *iptRedirector) ([]proxy.RuleListing, error) {
	r.mu.Lock()
	fl, fams := r.flavor, slices.Clone(r.fams)
	r.mu.Unlock()
	var out []proxy.RuleListing
	for _, f := range fams {
		var l []proxy.RuleListing
		err := b.ops.inNS(func() (err error) {
			l, err = iptables.ListOwned(ctx, iptables.NewRunner(fl, f), iptables.UserspaceChainPrefix)
			return err
		})
		out = append(out, l...)
		if err != nil {
			return out, fmt.Errorf("userspace mode: %w", err)
		}
	}
	return out, nil
}
