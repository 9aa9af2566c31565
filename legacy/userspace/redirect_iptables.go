package userspace

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/legacy/iptables"
	"github.com/kpproxy/kp/proxy"
)

// The iptables fallback: the same Rules as the nftables table, written as
// chains of kp's own (KP-USERSPACE-) through kp's iptables package, for a
// kernel without nftables NAT (iptables-legacy), one iptables-restore per
// family per write. The flavor is chosen as the iptables mode chooses it
// (--iptables-backend, else detection).
const (
	// chainPortals (nat; from PREROUTING and OUTPUT) redirects.
	chainPortals = iptables.UserspaceChainPrefix + "PORTALS"
	// chainServices (filter; from INPUT, FORWARD, OUTPUT, new connections)
	// drops LoadBalancer traffic from outside its source ranges and
	// refuses what has no endpoint. Traffic nat redirected no longer goes
	// to a Service address, so only what nat left matches here.
	chainServices = iptables.UserspaceChainPrefix + "SERVICES"
	// chainUnallocated (filter; from FORWARD and OUTPUT) drops the Service
	// CIDRs' addresses no Service has.
	chainUnallocated = iptables.UserspaceChainPrefix + "UNALLOCATED"
)

var ipJumps = []iptables.Jump{
	{Table: iptables.TableNAT, From: "PREROUTING", To: chainPortals, Comment: "kp userspace service portals"},
	{Table: iptables.TableNAT, From: "OUTPUT", To: chainPortals, Comment: "kp userspace service portals"},
	{Table: iptables.TableFilter, From: "INPUT", To: chainServices, Comment: "kp userspace services", Match: ctNew},
	{Table: iptables.TableFilter, From: "FORWARD", To: chainServices, Comment: "kp userspace services", Match: ctNew},
	{Table: iptables.TableFilter, From: "OUTPUT", To: chainServices, Comment: "kp userspace services", Match: ctNew},
	{Table: iptables.TableFilter, From: "FORWARD", To: chainUnallocated, Comment: "kp userspace unallocated service addresses", Match: ctNew},
	{Table: iptables.TableFilter, From: "OUTPUT", To: chainUnallocated, Comment: "kp userspace unallocated service addresses", Match: ctNew},
}

// ctNew limits the filter chains to a connection's first packet, as
// upstream's KUBE-SERVICES in filter: every later packet (the proxied
// bytes above all) skips them, whatever their length.
const ctNew = "-m conntrack --ctstate NEW"

// ipFeatures are the kernel features the chains use (probed before use).
var ipFeatures = []iptables.Feature{
	{Name: "the comment match", Table: iptables.TableNAT, Spec: `-m comment --comment "kp probe"`},
	{Name: "protocol tcp", Table: iptables.TableNAT, Spec: "-p tcp -m tcp --dport 1"},
	{Name: "protocol udp", Table: iptables.TableNAT, Spec: "-p udp -m udp --dport 1"},
	{Name: "the addrtype match", Table: iptables.TableNAT, Spec: "-m addrtype --dst-type LOCAL"},
	{Name: "the REDIRECT target", Table: iptables.TableNAT, Spec: "-p tcp -j REDIRECT --to-ports 1"},
	{Name: "the conntrack match in filter", Table: iptables.TableFilter, Spec: ctNew},
	{Name: "the REJECT target", Table: iptables.TableFilter, Spec: "-j REJECT"},
	{Name: "the REJECT target (tcp-reset)", Table: iptables.TableFilter, Spec: "-p tcp -j REJECT --reject-with tcp-reset"},
}

// renderIPTables is family f's rules as kp's chains.
func renderIPTables(f proxy.Family, rules Rules) iptables.OwnedRules {
	portals := &iptables.Chain{Table: iptables.TableNAT, Name: chainPortals}
	services := &iptables.Chain{Table: iptables.TableFilter, Name: chainServices}
	unallocated := &iptables.Chain{Table: iptables.TableFilter, Name: chainUnallocated}
	var drops []iptables.Rule
	for _, r := range rules.Redirects {
		for _, src := range orAny(r.SourceRanges) {
			if r.Verdict == VerdictDrop {
				// iptables refuses DROP in nat: what the nat rules before
				// did not redirect still goes to the address, and filter
				// drops it.
				drops = append(drops, iptables.Rule{Comment: r.Comment, Args: ipMatch(r, src) + " -j DROP"})
				continue
			}
			portals.Rules = append(portals.Rules, iptables.Rule{Comment: r.Comment,
				Args: fmt.Sprintf("%s -j REDIRECT --to-ports %d", ipMatch(r, src), r.ToPort)})
		}
	}
	services.Rules = drops
	for _, r := range rules.Rejects {
		services.Rules = append(services.Rules, iptables.Rule{Comment: r.Comment, Args: ipMatch(r, netip.Prefix{}) + ipReject(r.Protocol)})
	}
	for _, p := range rules.Drops {
		unallocated.Rules = append(unallocated.Rules, iptables.Rule{Comment: "unallocated Service addresses",
			Args: "-d " + p.String() + " -j DROP"})
	}
	return iptables.OwnedRules{Prefix: iptables.UserspaceChainPrefix,
		Chains: []*iptables.Chain{portals, services, unallocated}, Jumps: ipJumps}
}

// ipMatch matches r's destination (and src, when valid), as nftables'
// matchExprs does.
func ipMatch(r Redirect, src netip.Prefix) string {
	var parts []string
	if src.IsValid() {
		parts = append(parts, "-s "+src.String())
	}
	if r.NodePort {
		if r.NodePortAddrs.IsValid() {
			parts = append(parts, "-d "+r.NodePortAddrs.String())
		}
		parts = append(parts, "-m addrtype --dst-type LOCAL")
	} else {
		parts = append(parts, "-d "+netip.PrefixFrom(r.Addr, r.Addr.BitLen()).String())
	}
	if r.Protocol != "" {
		p := strings.ToLower(string(r.Protocol))
		parts = append(parts, fmt.Sprintf("-p %s -m %s --dport %d", p, p, r.Port))
	}
	return strings.Join(parts, " ")
}

// ipReject refuses at once, as the nftables table: a TCP reset, else
// ICMP port unreachable (REJECT's default in both families).
func ipReject(p v1.Protocol) string {
	if p == v1.ProtocolTCP {
		return " -j REJECT --reject-with tcp-reset"
	}
	return " -j REJECT"
}

// iptRedirector writes renderIPTables's chains with iptables-restore.
type iptRedirector struct {
	cfg proxy.Config
	log *slog.Logger
	ops *netOps

	mu     sync.Mutex
	flavor iptables.Flavor
	fams   []proxy.Family
}

func (r *iptRedirector) String() string { return RedirectIPTables + "-" + string(r.flavor) }

func (r *iptRedirector) families() []proxy.Family {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fams
}

// probe chooses the flavor (--iptables-backend, else as the iptables mode
// detects it) and checks that the kernel takes every feature the chains
// use: IPv4 must work; IPv6 is programmed when it works, and must when
// the configuration names IPv6 ranges.
func (r *iptRedirector) probe(ctx context.Context) error {
	return r.ops.inNS(func() error {
		fl, err := iptables.ParseFlavor(r.cfg.IPTablesBackend)
		if r.cfg.IPTablesBackend == "" {
			fl, err = iptables.FlavorAuto, nil
		}
		if err != nil {
			return err
		}
		if fl == iptables.FlavorAuto {
			var reason string
			if fl, reason, err = iptables.Detect(ctx, r.log); err != nil {
				return err
			}
			r.log.Info("iptables backend chosen for the userspace redirects", "backend", fl, "reason", reason)
		}
		if err := iptables.ProbeFeatures(ctx, fl, proxy.IPv4, ipFeatures); err != nil {
			return err
		}
		fams := []proxy.Family{proxy.IPv4}
		if err := iptables.ProbeFeatures(ctx, fl, proxy.IPv6, ipFeatures); err != nil {
			if needsIPv6(r.cfg) {
				return fmt.Errorf("the configuration has IPv6 ranges but %w", err)
			}
			r.log.Warn("IPv6 iptables does not work on this node; the userspace mode redirects IPv4 only", "err", err)
		} else {
			fams = append(fams, proxy.IPv6)
		}
		r.mu.Lock()
		r.flavor, r.fams = fl, fams
		r.mu.Unlock()
		return nil
	})
}

func (r *iptRedirector) write(ctx context.Context, f proxy.Family, rules Rules) error {
	r.mu.Lock()
	fl := r.flavor
	r.mu.Unlock()
	if fl == "" {
		return errors.New("the iptables redirects were not probed")
	}
	return r.ops.inNS(func() error {
		return iptables.WriteOwned(ctx, iptables.NewRunner(fl, f), renderIPTables(f, rules))
	})
}

// needsIPv6 reports whether the configuration names an IPv6 range.
func needsIPv6(cfg proxy.Config) bool {
	for _, ps := range [][]netip.Prefix{cfg.ClusterCIDRs, cfg.NodePortAddresses, cfg.ServiceCIDRs} {
		if len(proxy.FilterPrefixes(proxy.IPv6, ps)) > 0 {
			return true
		}
	}
	return false
}
