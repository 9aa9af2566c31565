package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"github.com/kpproxy/kp/legacy/iptables"
	"github.com/kpproxy/kp/proxy"
)

// Cleanup removes everything the ipvs mode wrote, and nothing else: the
// virtual servers kp created (those its KP-IPVS-SERVERS sets record, and
// those on kp-ipvs0's addresses), kp-ipvs0, the KP-IPVS- chains and their
// jumps (both iptables backends and families), then kp's ipsets. On a
// kernel without IPVS or ipset, their parts are skipped.
func (b *Backend) Cleanup(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.books = nil
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
	if n, err := b.cleanupServers(sets, onDummy); err != nil {
		errs = append(errs, err)
	} else if n > 0 {
		b.log.Info("ipvs cleanup: removed virtual servers", "count", n)
	}
	if err := b.links.Delete(); err != nil {
		errs = append(errs, err)
	}
	if b.cleanupChains != nil {
		if err := b.cleanupChains(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if haveIPSet && len(sets) > 0 {
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
	return errors.Join(errs...)
}

func (b *Backend) cleanupServers(sets map[string][]string, onDummy []netip.Addr) (int, error) {
	if b.handle == nil {
		if _, err := os.Stat("/proc/net/ip_vs"); err != nil {
			return 0, nil // no IPVS: nothing of kp's there
		}
		h, err := b.newHandle()
		if err != nil {
			return 0, fmt.Errorf("open IPVS: %w", err)
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
		return 0, fmt.Errorf("list IPVS virtual servers: %w", err)
	}
	n := 0
	var errs []error
	for _, s := range svcs {
		k, ok := kernelKey(s)
		if !ok || !(owned[k] || dummy[k.Addr]) {
			continue
		}
		if err := b.handle.DelService(s); err != nil {
			errs = append(errs, fmt.Errorf("delete virtual server %s: %w", k, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// defaultCleanupChains removes the KP-IPVS- chains from both iptables
// backends and families.
func defaultCleanupChains(ctx context.Context, b *Backend) error {
	_, err := iptables.CleanupChains(ctx, b.log, "ipvs", func(c string) bool { return strings.HasPrefix(c, iptables.IPVSChainPrefix) })
	return err
}
