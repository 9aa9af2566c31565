package ipvs

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kpproxy/kp/internal/sysctl"
	"github.com/kpproxy/kp/legacy/iptables"
	"github.com/kpproxy/kp/proxy"
)

// fullSyncInterval: past it a sync re-reads the kernel and reconciles
// everything, so edits behind kp's back are repaired.
const fullSyncInterval = time.Hour

// Backend is the ipvs mode.
type Backend struct {
	cfg      proxy.Config
	log      *slog.Logger
	masqMark uint32

	// mu serializes syncs, the drain loop and counter reads: they share
	// the IPVS socket.
	mu       sync.Mutex
	flavor   iptables.Flavor
	families []proxy.Family
	handle   Handle
	set      bool // setup done

	newHandle  func() (Handle, error)
	haveIPVS   func(ctx context.Context) bool
	links      Links
	ipset      IPSet
	runner     func(iptables.Flavor, proxy.Family) iptables.Runner
	detect     func(ctx context.Context, log *slog.Logger) (iptables.Flavor, string, error)
	sysctl     func(name, value string) error // sets one of Sysctls
	localAddrs func() ([]netip.Addr, error)
	now        func() time.Time
	drainEvery time.Duration
	// cleanupChains removes the KP-IPVS- chains (nil: tests with fakes).
	cleanupChains func(ctx context.Context) error

	// written is what the last successful sync wrote, per family; nil
	// after a failure (the next sync is full).
	written      map[proxy.Family]*written
	lastFull     time.Time
	lastSyncFull bool
	drain        *graceful
	counters     counterCache
	stop         chan struct{}
	// drifted: another process changed what kp wrote (drift.go); the
	// next Sync is full.
	drifted atomic.Bool
	// procTable is where the drift check reads the IPVS table in one read
	// (table.go); "": through the IPVS socket (tests with fakes).
	procTable string
}

// Option configures New.
type Option func(*Backend)

// WithKernel replaces the kernel seams (tests: fakes).
func WithKernel(h Handle, l Links, s IPSet, runners ...iptables.Runner) Option {
	return func(b *Backend) {
		b.newHandle = func() (Handle, error) { return h, nil }
		b.links, b.ipset = l, s
		byFam := map[proxy.Family]iptables.Runner{}
		b.families = nil
		for _, r := range runners {
			byFam[r.Family()] = r
			b.families = append(b.families, r.Family())
			b.flavor = r.Flavor()
		}
		b.runner = func(_ iptables.Flavor, f proxy.Family) iptables.Runner { return byFam[f] }
		b.sysctl = func(string, string) error { return nil }
		b.cleanupChains = nil
		b.procTable = ""
	}
}

// WithHandle wraps the IPVS socket kp opens (tests: fault injection,
// recording).
func WithHandle(wrap func(Handle) Handle) Option {
	return func(b *Backend) {
		open := b.newHandle
		b.newHandle = func() (Handle, error) {
			h, err := open()
			if err != nil {
				return nil, err
			}
			return wrap(h), nil
		}
	}
}

// WithClock replaces time.Now.
func WithClock(now func() time.Time) Option { return func(b *Backend) { b.now = now } }

// WithLocalAddrs replaces the listing of this namespace's addresses.
func WithLocalAddrs(fn func() ([]netip.Addr, error)) Option {
	return func(b *Backend) { b.localAddrs = fn }
}

// WithDrain sets the bound of a drained real server's life and how often
// drained ones are checked (0: only at syncs).
func WithDrain(bound, every time.Duration) Option {
	return func(b *Backend) { b.drain.bound, b.drainEvery = bound, every }
}

// New returns the ipvs backend for cfg.
func New(cfg proxy.Config, log *slog.Logger, opts ...Option) (*Backend, error) {
	masqMark, err := cfg.MasqueradeMark()
	if err != nil {
		return nil, err
	}
	if err := CheckScheduler(cfg.IPVS.Scheduler); err != nil {
		return nil, fmt.Errorf("--ipvs-scheduler %q: %w", cfg.IPVS.Scheduler, err)
	}
	if log == nil {
		log = slog.Default()
	}
	b := &Backend{
		cfg: cfg, log: log, masqMark: masqMark,
		families:   []proxy.Family{proxy.IPv4},
		newHandle:  newHandle,
		haveIPVS:   haveIPVS,
		links:      netlinkLinks{},
		ipset:      execIPSet{},
		runner:     iptables.NewRunner,
		detect:     iptables.Detect,
		sysctl:     writeSysctlIn(""),
		localAddrs: proxy.LocalAddrs,
		now:        time.Now,
		drainEvery: 5 * time.Second,
		drain:      newGraceful(DefaultDrainBound),
		procTable:  procIPVS,
	}
	if cfg.IPTablesBackend != "" {
		fl, err := iptables.ParseFlavor(cfg.IPTablesBackend)
		if err != nil {
			return nil, fmt.Errorf("--iptables-backend %q: %w", cfg.IPTablesBackend, err)
		}
		b.flavor = fl
	}
	b.cleanupChains = func(ctx context.Context) error { return defaultCleanupChains(ctx, b) }
	for _, o := range opts {
		o(b)
	}
	return b, nil
}

func (b *Backend) Mode() proxy.Mode { return proxy.ModeIPVS }

// LastSyncFull implements proxy.FullSyncReporter.
func (b *Backend) LastSyncFull() bool { return b.lastSyncFull }

func (b *Backend) scheduler() string {
	if b.cfg.IPVS.Scheduler == "" {
		return "rr"
	}
	return b.cfg.IPVS.Scheduler
}

// resolveFlavor chooses the iptables backend as the iptables mode does.
func (b *Backend) resolveFlavor(ctx context.Context) error {
	if b.flavor != "" && b.flavor != iptables.FlavorAuto {
		return nil
	}
	fl, reason, err := b.detect(ctx, b.log)
	if err != nil {
		return fmt.Errorf("choose the iptables backend: %w", err)
	}
	b.log.Info("iptables backend chosen", "backend", fl, "reason", reason)
	b.flavor = fl
	return nil
}

// setup runs once before the first sync: the IPVS socket, the sysctls
// IPVS needs, kp-ipvs0, IPVS's timeouts, and the drain loop.
func (b *Backend) setup(ctx context.Context) error {
	if b.set {
		return nil
	}
	if err := b.resolveFlavor(ctx); err != nil {
		return err
	}
	if b.handle == nil {
		h, err := b.newHandle()
		if err != nil {
			return fmt.Errorf("open IPVS: %w", err)
		}
		b.handle = h
	}
	for _, s := range b.Sysctls() {
		if err := b.sysctl(s.Name, s.Value); err != nil {
			return err
		}
	}
	if c := b.cfg.IPVS; c.TCPTimeout > 0 || c.TCPFinTimeout > 0 || c.UDPTimeout > 0 {
		if err := b.handle.SetConfig(ipvsConfig(c)); err != nil {
			return fmt.Errorf("set IPVS timeouts (--ipvs-tcp-timeout, --ipvs-tcpfin-timeout, --ipvs-udp-timeout): %w", err)
		}
	}
	if b.drainEvery > 0 {
		b.stop = make(chan struct{})
		go b.drainLoop(b.stop)
	}
	b.set = true
	return nil
}

func (b *Backend) drainLoop(stop chan struct{}) {
	t := time.NewTicker(b.drainEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		b.mu.Lock()
		if b.drain.len() > 0 && b.handle != nil {
			if err := b.drain.check(b.handle, b.now()); err != nil {
				b.log.Warn("drained real servers", "err", err)
			}
		}
		b.mu.Unlock()
	}
}

// Shutdown stops the drain loop (the kernel state stays, as in every mode).
func (b *Backend) Shutdown(context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stop != nil {
		close(b.stop)
		b.stop = nil
	}
	return nil
}

// Sysctls implements proxy.SysctlNeeder: what upstream's ipvs mode sets,
// and with StrictARP its ARP settings.
func (b *Backend) Sysctls() []proxy.Sysctl {
	out := []proxy.Sysctl{
		{Name: "net.ipv4.vs.conntrack", Value: "1", Why: "IPVS keeps conntrack entries, so iptables can masquerade"},
		{Name: "net.ipv4.vs.expire_nodest_conn", Value: "1",
			Why: "a connection to a deleted real server ends at its next packet, which is scheduled anew"},
		{Name: "net.ipv4.vs.expire_quiescent_template", Value: "1", Why: "session affinity stops sending new connections to a draining real server (weight 0)"},
		{Name: "net.ipv4.ip_forward", Value: "1", Why: "the node forwards to endpoints on other hosts"},
	}
	if b.cfg.IPVS.StrictARP {
		out = append(out,
			proxy.Sysctl{Name: "net.ipv4.conf.all.arp_ignore", Value: "1", Why: "strictARP: no ARP replies for the Service addresses on " + DummyName},
			proxy.Sysctl{Name: "net.ipv4.conf.all.arp_announce", Value: "2", Why: "strictARP: no Service address as an ARP source"})
	}
	return out
}

// writeSysctlIn sets a sysctl of Sysctls under dir, unless it has the
// value already.
func writeSysctlIn(dir sysctl.Dir) func(name, value string) error {
	return func(name, value string) error {
		if _, err := dir.Ensure(name, value); err != nil {
			return fmt.Errorf("set %s=%s: %w (in a container without privileges, /proc/sys is read-only: "+
				"run kp sysctl with the same config first, as the DaemonSet's init container does, or set it on the node)", name, value, err)
		}
		return nil
	}
}
