package ipvs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"github.com/moby/ipvs"

	"github.com/kpproxy/kp/legacy/iptables"
	"github.com/kpproxy/kp/proxy"
)

// probeMark is the firewall mark of the virtual server Probe creates and
// deletes to test the scheduler (a mark kp never uses otherwise).
const probeMark = 0x4b50

// Probe checks what the mode needs, naming the missing part and how to
// add it: IPVS (ip_vs), the scheduler's module (ip_vs_<name>), the
// ipset binary and kernel support, and the iptables backend.
func (b *Backend) Probe(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.resolveFlavor(ctx); err != nil {
		return err
	}
	if b.handle == nil {
		if !b.haveIPVS(ctx) {
			return errors.New("the kernel has no IPVS: the ip_vs module is not loaded; load it with " +
				"`modprobe ip_vs` on the node (and ip_vs_" + b.scheduler() + " for --ipvs-scheduler), or choose another mode")
		}
		h, err := b.newHandle()
		if err != nil {
			return fmt.Errorf("open IPVS (module ip_vs): %w", err)
		}
		b.handle = h
	}
	if err := b.probeScheduler(); err != nil {
		return err
	}
	if _, injected := b.ipset.(execIPSet); injected {
		name := fmt.Sprintf("KP-PROBE-%d", os.Getpid())
		in := "create " + name + " hash:ip,port family inet -exist\ndestroy " + name + "\n"
		if err := b.ipset.Restore(ctx, []byte(in)); err != nil {
			return fmt.Errorf("ipset does not work (modules ip_set, ip_set_hash_ipport; package ipset): %w", err)
		}
		if err := iptables.Probe(ctx, b.flavor, proxy.IPv4); err != nil {
			return err
		}
		if err := iptables.Probe(ctx, b.flavor, proxy.IPv6); err == nil {
			b.families = []proxy.Family{proxy.IPv4, proxy.IPv6}
		} else {
			b.log.Warn("IPv6 iptables does not work on this node; the ipvs mode programs IPv4 only", "err", err)
		}
	}
	return nil
}

// probeScheduler creates and deletes a firewall-mark virtual server with
// the scheduler: the kernel loads ip_vs_<name> on demand, and refuses when
// it cannot.
func (b *Backend) probeScheduler() error {
	sched := b.scheduler()
	svc := &ipvs.Service{FWMark: probeMark, AddressFamily: syscall.AF_INET, SchedName: sched, Netmask: 0xffffffff}
	if err := b.handle.NewService(svc); err != nil && !errors.Is(err, syscall.EEXIST) {
		if strings.Contains(err.Error(), "no such file") || errors.Is(err, syscall.ENOENT) {
			return fmt.Errorf("the IPVS scheduler %s is missing: load its module with `modprobe ip_vs_%s` on the node: %w", sched, sched, err)
		}
		return fmt.Errorf("IPVS refuses a virtual server with scheduler %s (module ip_vs_%s): %w", sched, sched, err)
	}
	if err := b.handle.DelService(svc); err != nil {
		return fmt.Errorf("IPVS: delete the probe's virtual server: %w", err)
	}
	return nil
}

// haveIPVS reports whether the kernel has IPVS in this namespace, loading
// ip_vs as upstream does when it is missing (kp in a pod needs the node's
// /lib/modules for that).
func haveIPVS(ctx context.Context) bool {
	if _, err := os.Stat("/proc/net/ip_vs"); err == nil {
		return true
	}
	_ = exec.CommandContext(ctx, "modprobe", "ip_vs").Run()
	_, err := os.Stat("/proc/net/ip_vs")
	return err == nil
}
