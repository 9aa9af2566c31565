package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"github.com/moby/ipvs"
	"golang.org/x/sys/unix"

	"github.com/kpproxy/kp/legacy/iptables"
	"github.com/kpproxy/kp/proxy"
)

// Cleanup removes everything the ipvs mode wrote, and nothing else: the
// virtual servers kp created (those its KP-IPVS-SERVERS sets record, and
// those on kp-ipvs0's addresses), kp-ipvs0, the KP-IPVS- chains and their
// jumps (both iptables backends and families), then kp's ipsets. On a
// kernel without IPVS or ipset, their parts are skipped.
func (b *Backend) Cleanup(ctx context.Context) error {
	_, err := b.cleanup(ctx, false)
	return err
}

// CleanupKeepingActive is Cleanup for a node that another mode now serves:
// a virtual server still in use (InUse) stays, with its address on
// kp-ipvs0, and so do kp's ipsets (which tell its NodePort virtual servers
// apart); a later call removes them once those connections have ended.
// IPVS takes a connection's packets in the INPUT hook, so only while its
// Service address is local, and drops those of a real server it no longer
// has: removing them at once would break every connection the ipvs mode
// made, where conntrack carries the other modes' over. It returns how many
// virtual servers stayed.
func (b *Backend) CleanupKeepingActive(ctx context.Context) (int, error) {
	return b.cleanup(ctx, true)
}

func (b *Backend) cleanup(ctx context.Context, keepActive bool) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.written = nil
	var errs []error
	var sets map[string][]string
	haveIPSet := true
	if s, err := b.ipset.List(ctx); err == nil {
		sets = s
	} else {
		haveIPSet = false
		b.log.Info("ipvs cleanup: no ipsets read", "reason", err)
	}
	var onDummy []netip.Addr
	if as, err := b.links.Addrs(); err == nil {
		onDummy = as
	} else {
		errs = append(errs, err)
	}
	n, kept, err := b.cleanupServers(sets, onDummy, keepActive)
	if err != nil {
		errs = append(errs, err)
	}
	if n > 0 {
		b.log.Info("ipvs cleanup: removed virtual servers", "count", n)
	}
	if len(kept) > 0 {
		b.log.Info("ipvs cleanup: virtual servers kept while their connections last", "count", len(kept))
	}
	if err := b.cleanupDummy(onDummy, kept); err != nil {
		errs = append(errs, err)
	}
	if b.cleanupChains != nil {
		if err := b.cleanupChains(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if haveIPSet && len(sets) > 0 && len(kept) == 0 {
		var in strings.Builder
		for _, n := range allSetNames() {
			if _, ok := sets[n]; ok {
				in.WriteString("destroy " + n + "\n")
			}
		}
		if err := b.ipset.Restore(ctx, []byte(in.String())); err != nil {
			errs = append(errs, fmt.Errorf("destroy kp's ipsets: %w", err))
		}
	}
	return len(kept), errors.Join(errs...)
}

// cleanupDummy deletes kp-ipvs0, or, while virtual servers are kept, the
// addresses none of them is on.
func (b *Backend) cleanupDummy(onDummy []netip.Addr, kept []vsKey) error {
	if len(kept) == 0 {
		return b.links.Delete()
	}
	keep := map[netip.Addr]bool{}
	for _, k := range kept {
		keep[k.Addr] = true
	}
	var errs []error
	for _, a := range onDummy {
		if !keep[a] {
			errs = append(errs, b.links.DelAddr(a))
		}
	}
	return errors.Join(errs...)
}

// cleanupServers deletes kp's virtual servers, but, with keepActive, those
// still in use (InUse), which it returns.
func (b *Backend) cleanupServers(sets map[string][]string, onDummy []netip.Addr, keepActive bool) (int, []vsKey, error) {
	if b.handle == nil {
		if _, err := os.Stat("/proc/net/ip_vs"); err != nil {
			return 0, nil, nil // no IPVS: nothing of kp's there
		}
		h, err := b.newHandle()
		if err != nil {
			return 0, nil, fmt.Errorf("open IPVS: %w", err)
		}
		b.handle = h
	}
	owned := map[vsKey]bool{}
	for _, f := range []proxy.Family{proxy.IPv4, proxy.IPv6} {
		for _, e := range sets[setName(f, setServers)] {
			if k, ok := parseIPPort(e); ok {
				owned[k] = true
			}
		}
	}
	dummy := map[netip.Addr]bool{}
	for _, a := range onDummy {
		dummy[a] = true
	}
	svcs, err := b.handle.GetServices()
	if err != nil {
		return 0, nil, fmt.Errorf("list IPVS virtual servers: %w", err)
	}
	n := 0
	var kept []vsKey
	var errs []error
	for _, s := range svcs {
		k, ok := kernelKey(s)
		if !ok || !(owned[k] || dummy[k.Addr]) {
			continue
		}
		if keepActive && InUse(b.handle, s) {
			kept = append(kept, k)
			continue
		}
		if err := b.handle.DelService(s); err != nil {
			errs = append(errs, fmt.Errorf("delete virtual server %s: %w", k, err))
			continue
		}
		n++
	}
	return n, kept, errors.Join(errs...)
}

// InUse says whether s carries connections that only IPVS can serve: an
// established TCP or SCTP connection, or a UDP flow IPVS still tracks (a
// UDP flow has no states: IPVS counts it inactive until its UDP timeout
// after the last packet). Such a flow's conntrack entry is IPVS's, so the
// new mode's NAT never sees its packets; once the virtual server is gone,
// IPVS drops the next one (expire_nodest_conn) until the kernel has expired
// the entry, which lost a UDP request in flight at a switch (VM,
// ipvs-nftables, 1 in 1,456). An unreadable list (a netlink timeout on a
// loaded node) counts as in use: a kept virtual server is looked at again
// at the next Retire, while a wrongly removed one drops its flow's packets.
func InUse(h Handle, s *ipvs.Service) bool {
	ds, err := h.GetDestinations(s)
	if err != nil {
		return true
	}
	for _, d := range ds {
		if d.ActiveConnections > 0 || s.Protocol == unix.IPPROTO_UDP && d.InactiveConnections > 0 {
			return true
		}
	}
	return false
}

// defaultCleanupChains removes the KP-IPVS- chains from both iptables
// backends and families.
func defaultCleanupChains(ctx context.Context, b *Backend) error {
	_, err := iptables.CleanupChains(ctx, b.log, "ipvs", func(c string) bool { return strings.HasPrefix(c, iptables.IPVSChainPrefix) })
	return err
}
