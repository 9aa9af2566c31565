package userspace

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
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
	// chainListeners (filter; from INPUT, new connections that nat did not
	// redirect) refuses the proxy's listener ports (Listener).
	chainListeners = iptables.UserspaceChainPrefix + "LISTENERS"
)

var ipJumps = []iptables.Jump{
	{Table: iptables.TableNAT, From: "PREROUTING", To: chainPortals, Comment: "kp userspace service portals"},
	{Table: iptables.TableNAT, From: "OUTPUT", To: chainPortals, Comment: "kp userspace service portals"},
	{Table: iptables.TableFilter, From: "INPUT", To: chainServices, Comment: "kp userspace services", Match: ctNew},
	{Table: iptables.TableFilter, From: "FORWARD", To: chainServices, Comment: "kp userspace services", Match: ctNew},
	{Table: iptables.TableFilter, From: "OUTPUT", To: chainServices, Comment: "kp userspace services", Match: ctNew},
	{Table: iptables.TableFilter, From: "FORWARD", To: chainUnallocated, Comment: "kp userspace unallocated service addresses", Match: ctNew},
	{Table: iptables.TableFilter, From: "OUTPUT", To: chainUnallocated, Comment: "kp userspace unallocated service addresses", Match: ctNew},
	{Table: iptables.TableFilter, From: "INPUT", To: chainListeners, Comment: "kp userspace listeners: only what kp redirected",
		Match: ctNew + " " + ctNotRedirected},
}

// ctNew limits the filter chains to a connection's first packet, as
// upstream's KUBE-SERVICES in filter: every later packet (the proxied
// bytes above all) skips them, whatever their length.
const ctNew = "-m conntrack --ctstate NEW"

// ctNotRedirected matches a connection whose conntrack entry was not
// destination-NATed: REDIRECT is a DNAT, so traffic nat sent to a listener
// never matches.
const ctNotRedirected = "-m conntrack ! --ctstate DNAT"

// ipFeatures are the kernel features the chains use (probed before use).
var ipFeatures = []iptables.Feature{
	{Name: "the comment match", Table: iptables.TableNAT, Spec: `-m comment --comment "kp probe"`},
	{Name: "protocol tcp", Table: iptables.TableNAT, Spec: "-p tcp -m tcp --dport 1"},
	{Name: "protocol udp", Table: iptables.TableNAT, Spec: "-p udp -m udp --dport 1"},
	{Name: "the addrtype match", Table: iptables.TableNAT, Spec: "-m addrtype --dst-type LOCAL"},
	{Name: "the REDIRECT target", Table: iptables.TableNAT, Spec: "-p tcp -j REDIRECT --to-ports 1"},
	{Name: "the conntrack match in filter", Table: iptables.TableFilter, Spec: ctNew},
	{Name: "the conntrack match's DNAT state", Table: iptables.TableFilter, Spec: ctNotRedirected},
	{Name: "the REJECT target", Table: iptables.TableFilter, Spec: "-j REJECT"},
	{Name: "the REJECT target (tcp-reset)", Table: iptables.TableFilter, Spec: "-p tcp -j REJECT --reject-with tcp-reset"},
}

// Chains the dispatch tries add under the prefix (short names: a trie
// chain's name grows by up to 12 characters, iptables allows 28).
const (
	triePortals  = iptables.UserspaceChainPrefix + "A" // nat, by address
	chainNPs     = iptables.UserspaceChainPrefix + "NODEPORTS"
	trieNPs      = iptables.UserspaceChainPrefix + "N" // nat, by port
	trieServices = iptables.UserspaceChainPrefix + "F" // filter, by address
	chainNPRej   = iptables.UserspaceChainPrefix + "NPREJECT"
	trieNPRej    = iptables.UserspaceChainPrefix + "R" // filter, by port
	trieListen   = iptables.UserspaceChainPrefix + "L" // filter, by port
)

// renderIPTables is family f's rules as kp's chains. The rules that match
// an address go through the iptables mode's address trie, those of
// NodePorts through its port trie (jumped to for local destinations), so a
// new connection walks tens of rules at 10,000 Services, not 10,000.
func renderIPTables(f proxy.Family, rules Rules) iptables.OwnedRules {
	var natAddr, natPorts, fAddr, fPorts []iptables.DispatchEntry
	var npPrefixes, npRejPrefixes []netip.Prefix
	seen := map[string]bool{}
	portEntry := func(r Redirect, args string) iptables.DispatchEntry {
		return iptables.DispatchEntry{Proto: strings.ToLower(string(r.Protocol)), Port: r.Port,
			Rule: iptables.Rule{Comment: r.Comment, Args: args}}
	}
	for _, r := range rules.Redirects {
		for _, src := range orAny(r.SourceRanges) {
			switch {
			case r.Verdict == VerdictDrop:
				// iptables refuses DROP in nat: what the nat rules did not
				// redirect still goes to the address, and filter drops it.
				fAddr = append(fAddr, iptables.DispatchEntry{Addr: r.Addr,
					Rule: iptables.Rule{Comment: r.Comment, Args: ipMatch(r, src) + " -j DROP"}})
			case r.NodePort:
				if !slices.Contains(npPrefixes, r.NodePortAddrs) {
					npPrefixes = append(npPrefixes, r.NodePortAddrs)
				}
				args := fmt.Sprintf("%s -j REDIRECT --to-ports %d", portMatch(r), r.ToPort)
				if !seen["nat "+args] {
					seen["nat "+args] = true
					natPorts = append(natPorts, portEntry(r, args))
				}
			default:
				natAddr = append(natAddr, iptables.DispatchEntry{Addr: r.Addr, Rule: iptables.Rule{Comment: r.Comment,
					Args: fmt.Sprintf("%s -j REDIRECT --to-ports %d", ipMatch(r, src), r.ToPort)}})
			}
		}
	}
	for _, r := range rules.Rejects {
		switch {
		case r.NodePort:
			if !slices.Contains(npRejPrefixes, r.NodePortAddrs) {
				npRejPrefixes = append(npRejPrefixes, r.NodePortAddrs)
			}
			args := portMatch(r) + ipReject(r.Protocol)
			if !seen["filter "+args] {
				seen["filter "+args] = true
				fPorts = append(fPorts, portEntry(r, args))
			}
		default:
			// A port's own reject (a TCP reset) before its ClusterIP's
			// reject of every other port.
			order := 0
			if r.Protocol == "" {
				order = 1
			}
			fAddr = append(fAddr, iptables.DispatchEntry{Addr: r.Addr, Order: order,
				Rule: iptables.Rule{Comment: r.Comment, Args: ipMatch(r, netip.Prefix{}) + ipReject(r.Protocol)}})
		}
	}
	var chains []*iptables.Chain
	// local jumps to a port trie's chain for each NodePort address prefix.
	local := func(ps []netip.Prefix, to string) []iptables.Rule {
		var out []iptables.Rule
		for _, p := range ps {
			m := "-m addrtype --dst-type LOCAL"
			if p.IsValid() {
				m = "-d " + p.String() + " " + m
			}
			out = append(out, iptables.Rule{Comment: "NodePorts", Args: m + " -j " + to})
		}
		return out
	}
	top, sub := iptables.AddrDispatch(iptables.TableNAT, f, triePortals, natAddr)
	// The NodePorts last: a local address can be a Service's too.
	top = append(top, local(npPrefixes, chainNPs)...)
	chains = append(append(chains, &iptables.Chain{Table: iptables.TableNAT, Name: chainPortals, Rules: top}), sub...)
	if len(natPorts) > 0 {
		top, sub = iptables.PortDispatch(iptables.TableNAT, f, trieNPs, natPorts)
		chains = append(append(chains, &iptables.Chain{Table: iptables.TableNAT, Name: chainNPs, Rules: top}), sub...)
	}
	top, sub = iptables.AddrDispatch(iptables.TableFilter, f, trieServices, fAddr)
	top = append(top, local(npRejPrefixes, chainNPRej)...)
	chains = append(append(chains, &iptables.Chain{Table: iptables.TableFilter, Name: chainServices, Rules: top}), sub...)
	if len(fPorts) > 0 {
		top, sub = iptables.PortDispatch(iptables.TableFilter, f, trieNPRej, fPorts)
		chains = append(append(chains, &iptables.Chain{Table: iptables.TableFilter, Name: chainNPRej, Rules: top}), sub...)
	}
	unallocated := &iptables.Chain{Table: iptables.TableFilter, Name: chainUnallocated}
	for _, p := range rules.Drops {
		unallocated.Rules = append(unallocated.Rules, iptables.Rule{Comment: "unallocated Service addresses",
			Args: "-d " + p.String() + " -j DROP"})
	}
	chains = append(chains, unallocated)
	chains = append(chains, listenerChains(f, rules.Listeners)...)
	return iptables.OwnedRules{Prefix: iptables.UserspaceChainPrefix, Chains: chains, Jumps: ipJumps}
}

// listenerChains refuse every listener port, through the port trie:
// reached only by new connections that nat did not redirect.
func listenerChains(f proxy.Family, ls []Listener) []*iptables.Chain {
	top := &iptables.Chain{Table: iptables.TableFilter, Name: chainListeners}
	if len(ls) == 0 {
		return []*iptables.Chain{top}
	}
	es := make([]iptables.DispatchEntry, 0, len(ls))
	for _, l := range ls {
		r := Redirect{Protocol: l.Protocol, Port: int32(l.Port)}
		es = append(es, iptables.DispatchEntry{Proto: strings.ToLower(string(l.Protocol)), Port: r.Port,
			Rule: iptables.Rule{Comment: l.Comment, Args: portMatch(r) + ipReject(l.Protocol)}})
	}
	rules, sub := iptables.PortDispatch(iptables.TableFilter, f, trieListen, es)
	top.Rules = rules
	return append([]*iptables.Chain{top}, sub...)
}

// portMatch matches r's protocol and port.
func portMatch(r Redirect) string {
	p := strings.ToLower(string(r.Protocol))
	return fmt.Sprintf("-p %s -m %s --dport %d", p, p, r.Port)
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
	for _, ps := range [][]netip.Prefix{cfg.ClusterCIDRs, cfg.DetectLocal.PodCIDRs, cfg.NodePortAddresses, cfg.ServiceCIDRs} {
		if len(proxy.FilterPrefixes(proxy.IPv6, ps)) > 0 {
			return true
		}
	}
	return false
}
