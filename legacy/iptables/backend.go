package iptables

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/kpproxy/kp/internal/sysctl"
	"github.com/kpproxy/kp/proxy"
)

// fullSyncInterval is upstream's FullSyncPeriod: past it, a sync re-reads
// the kernel and rewrites every chain, whatever changed, so that edits made
// behind kp's back are repaired. (kp's runner calls Sync every
// --sync-period; those syncs are partial.)
const fullSyncInterval = time.Hour

// Backend is the iptables mode: one Runner per IP family.
type Backend struct {
	cfg      proxy.Config
	log      *slog.Logger
	masqMark uint32

	// mu guards flavor, runners and families, which the status API reads
	// (EndpointCounters) while a sync may be choosing them.
	mu        sync.Mutex
	flavor    Flavor // "" until resolved (auto: Detect)
	runners   map[proxy.Family]Runner
	families  []proxy.Family
	newRunner func(Flavor, proxy.Family) Runner
	detect    func(ctx context.Context, log *slog.Logger) (Flavor, string, error)
	probe     func(ctx context.Context, fl Flavor, f proxy.Family) error
	cleanup   func(ctx context.Context, log *slog.Logger) error
	now       func() time.Time
	// localAddrs lists this namespace's addresses (--nodeport-addresses CIDRs).
	localAddrs func() ([]netip.Addr, error)
	// routeLocalnet enables net.ipv4.conf.all.route_localnet, which
	// localhost NodePorts need.
	routeLocalnet      func() error
	localhostNodePorts bool
	localhostChecked   bool
	// warnedPrimary: the Node has no primary IP of the family (warned once).
	warnedPrimary map[proxy.Family]bool

	// books is what kp knows it wrote, per family; nil means unknown
	// (start, after a failed sync, hourly): the next sync is full.
	books        map[proxy.Family]*book
	lastFull     time.Time
	lastSyncFull bool
	// noCacheHint: this iptables refused cacheHintLine (restore_input.go).
	noCacheHint bool
	// stageChains bounds a staging restore (stage.go); 0 stages nothing.
	stageChains int
	// counters is the last read of the DNAT rules' counters, shared by
	// status API requests for countersMaxAge.
	counters counterCache

	// inject adds a rule to one service port's chains (tests: a batch
	// iptables-restore refuses).
	inject  map[proxy.ServicePortName]string
	metrics *metrics
	// drift is the drift check's state (drift.go); its mu is held by Sync.
	drift driftState
}

// book is kp's record of one family: each service port's rendering, and
// the digest of every chain in the kernel as kp last wrote it.
type book struct {
	services map[proxy.ServicePortName]*rendered
	written  map[chainKey]string
	// skel is the shared chains (static ones and dispatch tries) as last
	// built, for the inputs in skelKey: a sync whose changes leave every
	// service port's shared rules as they were (an endpoint change, the
	// most common) reuses it instead of rebuilding the tries.
	skel    []*Chain
	skelKey string
}

type chainKey struct {
	table Table
	name  string
}

// Option configures New.
type Option func(*Backend)

// WithFlavor chooses the iptables backend; without it (or with "auto" in
// cfg.IPTablesBackend) Detect chooses, as upstream's iptables-wrapper.
func WithFlavor(fl Flavor) Option { return func(b *Backend) { b.flavor = fl } }

// WithRunners replaces the exec Runners (tests: Fake). The families
// programmed are the runners' families.
func WithRunners(rs ...Runner) Option {
	return func(b *Backend) {
		b.runners = map[proxy.Family]Runner{}
		b.families = nil
		for _, r := range rs {
			b.runners[r.Family()] = r
			b.families = append(b.families, r.Family())
			b.flavor = r.Flavor()
		}
	}
}

// WithClock replaces time.Now.
func WithClock(now func() time.Time) Option { return func(b *Backend) { b.now = now } }

// WithLocalAddrs replaces the listing of this namespace's addresses.
func WithLocalAddrs(fn func() ([]netip.Addr, error)) Option {
	return func(b *Backend) { b.localAddrs = fn }
}

// WithRouteLocalnet replaces the write of net.ipv4.conf.all.route_localnet.
func WithRouteLocalnet(fn func() error) Option {
	return func(b *Backend) { b.routeLocalnet = fn }
}

// WithInjectedRule adds a rule with args to the first chain of service port
// name: a way for tests to make iptables-restore refuse a batch.
func WithInjectedRule(name proxy.ServicePortName, args string) Option {
	return func(b *Backend) {
		if b.inject == nil {
			b.inject = map[proxy.ServicePortName]string{}
		}
		b.inject[name] = args
	}
}

// WithStamps replaces the reading of the tables' Stamps (tests with Fake
// runners: an error makes every drift check read the tables).
func WithStamps(fn func(Flavor, proxy.Family) (Stamp, error)) Option {
	return func(b *Backend) { b.drift.stamp = fn }
}

// WithStaging sets the most chains of one staging restore (stage.go); 0
// turns staging off, so that a full sync is one restore per family.
func WithStaging(chains int) Option { return func(b *Backend) { b.stageChains = chains } }

// New returns the iptables backend for cfg. The flavor comes from
// cfg.IPTablesBackend ("auto", "" or a Flavor) unless WithFlavor says.
func New(cfg proxy.Config, log *slog.Logger, opts ...Option) (*Backend, error) {
	masqMark, err := cfg.MasqueradeMark()
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	b := &Backend{
		cfg: cfg, log: log, masqMark: masqMark,
		families:      []proxy.Family{proxy.IPv4, proxy.IPv6},
		newRunner:     NewRunner,
		detect:        Detect,
		probe:         Probe,
		cleanup:       defaultCleanup,
		now:           time.Now,
		localAddrs:    proxy.LocalAddrs,
		warnedPrimary: map[proxy.Family]bool{},
		metrics:       newMetrics(),
		routeLocalnet: writeRouteLocalnet,
		stageChains:   stageMaxChains,
	}
	if cfg.IPTablesBackend != "" {
		fl, err := ParseFlavor(cfg.IPTablesBackend)
		if err != nil {
			return nil, fmt.Errorf("--iptables-backend %q: %w", cfg.IPTablesBackend, err)
		}
		b.flavor = fl
	}
	for _, o := range opts {
		o(b)
	}
	return b, nil
}

func (b *Backend) Mode() proxy.Mode { return proxy.ModeIPTables }

// LastSyncFull reports whether the last Sync rewrote every chain
// (proxy.FullSyncReporter).
func (b *Backend) LastSyncFull() bool { return b.lastSyncFull }

// Flavor is the iptables backend in use ("" before Probe or Sync chose).
func (b *Backend) Flavor() Flavor {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.flavor
}

// resolveFlavor runs Detect when the flavor is auto.
func (b *Backend) resolveFlavor(ctx context.Context) error {
	if fl := b.Flavor(); fl != "" && fl != FlavorAuto {
		return nil
	}
	fl, reason, err := b.detect(ctx, b.log)
	if err != nil {
		return fmt.Errorf("choose the iptables backend: %w", err)
	}
	b.log.Info("iptables backend chosen", "backend", fl, "reason", reason)
	b.mu.Lock()
	b.flavor = fl
	b.mu.Unlock()
	return nil
}

// programmed is the families kp programs.
func (b *Backend) programmed() []proxy.Family {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.families)
}

// Probe checks that the chosen flavor runs every rule kp writes, for IPv4
// and IPv6. IPv4 must work. IPv6 is programmed when it works; when it does
// not, kp runs IPv4 only with a warning, unless the configuration names an
// IPv6 range (--cluster-cidr, --nodeport-addresses, --service-cidrs), when
// the node clearly needs it and the probe's error is returned.
func (b *Backend) Probe(ctx context.Context) error {
	if err := b.resolveFlavor(ctx); err != nil {
		return err
	}
	b.mu.Lock()
	injected := b.runners != nil
	b.mu.Unlock()
	if injected {
		return nil // injected runners: nothing to probe
	}
	fl := b.Flavor()
	if err := b.probe(ctx, fl, proxy.IPv4); err != nil {
		return err
	}
	fams := []proxy.Family{proxy.IPv4}
	if err := b.probe(ctx, fl, proxy.IPv6); err != nil {
		if b.needsIPv6() {
			return fmt.Errorf("the configuration has IPv6 ranges but %w", err)
		}
		b.log.Warn("IPv6 iptables does not work on this node; programming IPv4 only", "err", err)
	} else {
		fams = append(fams, proxy.IPv6)
	}
	b.mu.Lock()
	b.families = fams
	b.mu.Unlock()
	return nil
}

func (b *Backend) needsIPv6() bool {
	for _, ps := range [][]netip.Prefix{b.cfg.ClusterCIDRs, b.cfg.DetectLocal.PodCIDRs, b.cfg.NodePortAddresses, b.cfg.ServiceCIDRs} {
		if len(proxy.FilterPrefixes(proxy.IPv6, ps)) > 0 {
			return true
		}
	}
	return false
}

func (b *Backend) runner(f proxy.Family) Runner {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.runners == nil {
		b.runners = map[proxy.Family]Runner{}
	}
	r := b.runners[f]
	if r == nil {
		r = b.newRunner(b.flavor, f)
		b.runners[f] = r
	}
	return r
}

// checkLocalhost decides, once, whether IPv4 NodePorts answer on
// 127.0.0.0/8: when Sysctls asks for route_localnet and it is on.
func (b *Backend) checkLocalhost() {
	if b.localhostChecked {
		return
	}
	b.localhostChecked = true
	if len(b.Sysctls()) == 0 {
		return
	}
	if err := b.routeLocalnet(); err != nil {
		// kp proxy has warned about the sysctl itself (naming its value
		// and the fix) when it started this mode: this is the consequence.
		b.log.Info("route_localnet is not 1 and cannot be set; IPv4 NodePorts will not answer on localhost", "err", err)
		return
	}
	b.localhostNodePorts = true
}

// Sysctls implements proxy.SysctlNeeder: route_localnet when IPv4
// NodePorts answer on 127.0.0.0/8 (upstream's --iptables-localhost-nodeports):
// only when they answer on every local address or on CIDRs holding
// loopback. Without it the kernel drops such packets as martians after
// DNAT.
func (b *Backend) Sysctls() []proxy.Sysctl {
	if !b.cfg.LocalhostNodePorts || b.cfg.NodePortPrimary {
		return nil
	}
	if len(b.cfg.NodePortAddresses) > 0 && !slices.ContainsFunc(b.cfg.NodePortAddresses, func(p netip.Prefix) bool {
		return p.Contains(netip.MustParseAddr("127.0.0.1"))
	}) {
		return nil
	}
	return []proxy.Sysctl{{Name: routeLocalnet, Value: "1", Why: "IPv4 NodePorts answer on 127.0.0.1 (localhostNodePorts)"}}
}

// Cleanup removes every KP- chain and the jumps to them, from both
// flavors and both families.
func (b *Backend) Cleanup(ctx context.Context) error {
	b.drift.mu.Lock()
	defer b.drift.mu.Unlock()
	b.books = nil
	return b.cleanup(ctx, b.log)
}

// EndpointCounters implements proxy.CounterReporter: the counters of the
// DNAT rule of each endpoint's KP-SEP- chain, which the nat table runs
// for a connection's first packet only, summed over the families.
func (b *Backend) EndpointCounters(s *proxy.State) (map[proxy.EndpointRef]proxy.EndpointCounter, error) {
	if fl := b.Flavor(); fl == "" || fl == FlavorAuto {
		return nil, nil // nothing programmed yet
	}
	dnat, err := b.dnatCounters()
	if err != nil {
		return nil, err
	}
	out := map[proxy.EndpointRef]proxy.EndpointCounter{}
	for name, sp := range s.Services {
		for _, e := range s.Endpoints[name] {
			if c, ok := dnat[sepChainName(sp, e)]; ok {
				out[proxy.EndpointRef{ServicePort: name, Endpoint: e.AddrPort()}] = c
			}
		}
	}
	return out, nil
}

// countersMaxAge bounds how often counter reads run iptables-save -c, which
// reads and prints the whole nat table (seconds of CPU at tens of thousands
// of rules): status API clients polling faster (kp top every 2 s, several
// at once) share one read.
const countersMaxAge = time.Second

type counterCache struct {
	mu   sync.Mutex
	at   time.Time
	dnat map[string]proxy.EndpointCounter
}

// dnatCounters returns each KP- chain's DNAT rule counters, read at most
// once per countersMaxAge.
func (b *Backend) dnatCounters() (map[string]proxy.EndpointCounter, error) {
	c := &b.counters
	c.mu.Lock()
	defer c.mu.Unlock()
	now := b.now()
	if c.dnat != nil && now.Sub(c.at) < countersMaxAge && !now.Before(c.at) {
		return c.dnat, nil
	}
	dnat := map[string]proxy.EndpointCounter{}
	for _, f := range b.programmed() {
		data, err := b.runner(f).Save(context.Background(), TableNAT, true)
		if err != nil {
			return nil, fmt.Errorf("read %s counters: %w", f, err)
		}
		dumps, err := ParseSave(data)
		if err != nil {
			return nil, fmt.Errorf("read %s counters: %w", f, err)
		}
		d := dumps[TableNAT]
		if d == nil {
			continue
		}
		for chain, rs := range d.Rules {
			if !isKPChain(chain) {
				continue
			}
			for _, r := range rs {
				if containsWord(r.Spec, "DNAT") {
					sum := dnat[chain]
					dnat[chain] = proxy.EndpointCounter{Packets: sum.Packets + r.Packets, Bytes: sum.Bytes + r.Bytes}
				}
			}
		}
	}
	c.at, c.dnat = now, dnat
	return dnat, nil
}

// routeLocalnet is the sysctl localhost NodePorts need.
const routeLocalnet = "net.ipv4.conf.all.route_localnet"

func writeRouteLocalnet() error {
	if _, err := sysctl.Dir("").Ensure(routeLocalnet, "1"); err != nil {
		return fmt.Errorf("set %s=1: %w (in a container without privileges, /proc/sys is read-only: "+
			"run kp sysctl with the same config first, as the DaemonSet's init container does, or set it on the node)", routeLocalnet, err)
	}
	return nil
}

// defaultCleanup is the plumbing's Cleanup (every KP- chain, both flavors
// and families).
func defaultCleanup(ctx context.Context, log *slog.Logger) error {
	_, err := Cleanup(ctx, log)
	return err
}

// NodePortScope implements proxy.NodePortScoper: --nodeport-addresses as
// this mode was given it.
func (b *Backend) NodePortScope() ([]netip.Prefix, bool) {
	return b.cfg.NodePortAddresses, b.cfg.NodePortPrimary
}
