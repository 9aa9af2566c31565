package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"github.com/moby/ipvs"

	"github.com/kpproxy/kp/legacy/iptables"
	"github.com/kpproxy/kp/proxy"
)

// Listing formats of the ipvs mode's own (besides iptables-save).
const (
	// ListingFormatIPVS is the virtual servers as ipvsadm -Ln prints
	// them (ListVirtualServers).
	ListingFormatIPVS = "ipvs"
	// ListingFormatIPSet is kp's sets as ipset save prints their entries.
	ListingFormatIPSet = "ipset"
)

// ListRules implements proxy.RuleLister: kp's virtual servers with their
// scheduler, persistence and real servers (as ipvsadm -Ln prints them),
// kp's ipsets (as ipset save), and the KP-IPVS- chains of each family (as
// iptables-save -c), all read from the kernel.
func (b *Backend) ListRules(ctx context.Context) ([]proxy.RuleListing, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.handle == nil {
		return nil, errors.New("ipvs mode: not synced yet, so the IPVS socket is not open")
	}
	sets, err := b.ipset.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("ipvs mode: list kp's ipsets: %w", err)
	}
	owned := map[vsKey]bool{}
	for _, f := range []proxy.Family{proxy.IPv4, proxy.IPv6} {
		for _, e := range sets[setName(f, setServers)] {
			if k, ok := parseIPPort(e); ok {
				owned[k] = true
			}
		}
	}
	table, err := b.readTable()
	if err != nil {
		return nil, fmt.Errorf("ipvs mode: %w", err)
	}
	for k := range table {
		if !owned[k] {
			delete(table, k)
		}
	}
	// /proc prints persistence timeouts in jiffies: the seconds come from
	// one netlink dump of the virtual servers (without their real
	// servers, which is what makes netlink slow at scale).
	if svcs, err := b.handle.GetServices(); err == nil {
		for _, s := range svcs {
			if k, ok := kernelKey(s); ok && table[k] != nil && table[k].procTimeout {
				table[k].svc.Timeout, table[k].procTimeout = s.Timeout, false
			}
		}
	}
	out := []proxy.RuleListing{
		{Where: "ipvs virtual servers", Format: ListingFormatIPVS, Text: ListVirtualServers(table)},
		{Where: "ipset KP-", Format: ListingFormatIPSet, Text: listSets(sets)},
	}
	for _, f := range b.families {
		l, err := iptables.ListOwned(ctx, b.runner(b.flavor, f), iptables.IPVSChainPrefix)
		out = append(out, l...)
		if err != nil {
			return out, fmt.Errorf("ipvs mode: %w", err)
		}
	}
	return out, nil
}

// ListVirtualServers prints virtual servers as ipvsadm -Ln does (numeric,
// sorted by protocol, address and port; real servers by address):
//
//	Prot LocalAddress:Port Scheduler Flags
//	  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn
//	TCP  10.96.0.10:80 rr persistent 10800
//	  -> 10.244.1.2:8080              Masq    1      0          0
func ListVirtualServers(table map[vsKey]*kernelServer) string {
	var sb strings.Builder
	sb.WriteString("Prot LocalAddress:Port Scheduler Flags\n")
	sb.WriteString("  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n")
	for _, k := range sortedKeys(table) {
		ks := table[k]
		fmt.Fprintf(&sb, "%-4s %s %s", k.Proto, netip.AddrPortFrom(k.Addr, k.Port), ks.svc.SchedName)
		if ks.svc.Flags&ipvsFlagPersistent != 0 {
			fmt.Fprintf(&sb, " persistent %d", ks.persistence())
		}
		sb.WriteByte('\n')
		dests := slices.Clone(ks.dests)
		sort.Slice(dests, func(i, j int) bool { return destAddr(dests[i]).Compare(destAddr(dests[j])) < 0 })
		for _, d := range dests {
			fmt.Fprintf(&sb, "  -> %-28s %-7s %-6d %-10d %d\n", destAddr(d), forward(d), d.Weight, d.ActiveConnections, d.InactiveConnections)
		}
	}
	return sb.String()
}

// persistence is the server's persistence timeout in seconds. Read from
// /proc only (netlink failed) it may be in jiffies (sameTimeout): then the
// largest HZ that gives whole seconds is guessed.
func (ks *kernelServer) persistence() uint32 {
	t := ks.svc.Timeout
	if !ks.procTimeout {
		return t
	}
	for _, hz := range []uint32{1000, 300, 250, 100} {
		if t >= hz && t%hz == 0 {
			return t / hz
		}
	}
	return t
}

func destAddr(d *ipvs.Destination) netip.AddrPort {
	a, _ := netip.AddrFromSlice(d.Address)
	return netip.AddrPortFrom(a.Unmap(), d.Port)
}

// forward is ipvsadm's name of a real server's forwarding method.
func forward(d *ipvs.Destination) string {
	switch d.ConnectionFlags & ipvs.ConnFwdMask {
	case ipvs.ConnectionFlagMasq:
		return "Masq"
	case ipvs.ConnectionFlagTunnel:
		return "Tunnel"
	case ipvs.ConnectionFlagDirectRoute:
		return "Route"
	}
	return "Local"
}

// listSets prints kp's sets as ipset save lists their entries, by set
// name, entries sorted.
func listSets(sets map[string][]string) string {
	names := make([]string, 0, len(sets))
	for n := range sets {
		names = append(names, n)
	}
	sort.Strings(names)
	var sb strings.Builder
	for _, n := range names {
		fmt.Fprintf(&sb, "create %s\n", n)
		es := slices.Clone(sets[n])
		sort.Strings(es)
		for _, e := range es {
			fmt.Fprintf(&sb, "add %s %s\n", n, e)
		}
	}
	return sb.String()
}
