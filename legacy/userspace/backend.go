package userspace

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
)

// Backend is the userspace mode.
type Backend struct {
	cfg   proxy.Config
	log   *slog.Logger
	ops   netOps
	now   func() time.Time
	idle  time.Duration // UDP session idle timeout
	stats *stats
	conns *connSet
	// red writes the redirect rules (chosen by Probe).
	red redirector
	// nodeIPs are the Node's addresses (clients inside the cluster).
	nodeIPs atomic.Pointer[[]netip.Addr]

	// rlimit is RLIMIT_NOFILE as the last Probe or Sync read it (limits);
	// noFile reads it for a sync (tests inject a limit).
	rlimit atomic.Pointer[rlimitInfo]
	noFile func() rlimitInfo
	// listenerSockets are the sockets the listeners hold (fdRoom);
	// fdLogged is when fdRefused last logged (unix nanoseconds).
	listenerSockets atomic.Int64
	fdLogged        atomic.Int64
	// rulesRemoved: Cleanup has run, so no rule redirects to or filters
	// for the listeners still open (a switch's drain); UDP opens no new
	// session then (udpProxy.session).
	rulesRemoved atomic.Bool
	// handover is the drain's hand-over of UDP flows to the next mode,
	// from Cleanup on (handover.go).
	handover atomic.Pointer[handover]

	// mu guards the proxies, which Sync changes and Shutdown stops.
	mu       sync.Mutex
	proxies  map[proxyKey]portProxy
	down     bool
	expiring bool // the affinity expiry loop runs
	// refused are the service ports the last sync gave no listener, for
	// want of file descriptors (fdbudget.go), sorted.
	refused []proxy.ServicePortName
	// warnedPrimary: "primary" NodePorts of a family fell back to every
	// local address for want of a Node IP, and that was logged.
	warnedPrimary map[proxy.Family]bool
	// lastRules is what kp last wrote, per family; a family missing is
	// unknown (start, after a failed write) and written by the next sync.
	lastRules map[proxy.Family]Rules
	lastWrite time.Time // when both families were last written
	// last is each service port's listener ports and usability as the
	// last successful sync left them; nil after a failure (the next sync
	// looks at every service port).
	last map[proxy.ServicePortName]portState
	// drift is the drift check's state (drift.go).
	drift driftState
}

// proxyKey names one listener: a service port's internal or external
// traffic (separate, because the two may follow different traffic
// policies).
type proxyKey struct {
	name     proxy.ServicePortName
	external bool
}

// portProxy is one listener with its balancers.
type portProxy interface {
	port() int
	stop()
	balancers() *familyBalancers
	protocol() v1.Protocol
	// sockets is how many descriptors it holds.
	sockets() int
	// listenAddrs are the addresses its sockets listen on.
	listenAddrs() []string
}

func (p *tcpProxy) balancers() *familyBalancers { return p.bal }
func (p *udpProxy) balancers() *familyBalancers { return p.bal }
func (p *tcpProxy) protocol() v1.Protocol       { return v1.ProtocolTCP }
func (p *udpProxy) protocol() v1.Protocol       { return v1.ProtocolUDP }
func (p *tcpProxy) sockets() int                { return 1 }
func (p *udpProxy) sockets() int                { return len(p.socks) }

// Option configures New.
type Option func(*Backend)

// WithNetOps replaces how sockets and netlink connections are opened
// (tests: inside a network namespace).
func WithNetOps(ops netOps) Option { return func(b *Backend) { b.ops = ops } }

// New returns the userspace backend for cfg.
func New(cfg proxy.Config, log *slog.Logger, opts ...Option) (*Backend, error) {
	if log == nil {
		log = slog.Default()
	}
	if _, err := ParseRedirect(cfg.UserspaceRedirect); err != nil {
		return nil, err
	}
	idle := udpIdleTimeout
	if cfg.UserspaceUDPIdleTimeout > 0 {
		idle = cfg.UserspaceUDPIdleTimeout
	}
	b := &Backend{cfg: cfg, log: log, ops: hostOps(), now: time.Now, idle: idle,
		stats: newStats(), conns: newConnSet(), proxies: map[proxyKey]portProxy{}, warnedPrimary: map[proxy.Family]bool{}}
	b.noFile = b.syncNoFile
	for _, o := range opts {
		o(b)
	}
	return b, nil
}

func (b *Backend) Mode() proxy.Mode { return proxy.ModeUserspace }

// Collectors are the proxy's own metrics, for the metrics server.
func (b *Backend) Collectors() []prometheus.Collector { return b.stats.collectors() }

// Probe chooses how Service traffic is redirected to the listeners
// (--userspace-redirect: nftables when the kernel runs it, else iptables
// REDIRECT; each probed with a throwaway table or chain) and raises
// RLIMIT_NOFILE: every listener and every proxied connection holds
// descriptors.
func (b *Backend) Probe(ctx context.Context) error {
	b.setLimits(raiseNoFile(b.log))
	red, err := b.chooseRedirector(ctx)
	if err != nil {
		return err
	}
	b.log.Info("userspace proxy redirects", "with", red.String(), "families", red.families())
	b.mu.Lock()
	b.red = red
	b.mu.Unlock()
	return nil
}

// Redirector is how the redirects are written: "nftables",
// "iptables-nft" or "iptables-legacy" ("" before Probe).
func (b *Backend) Redirector() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.red == nil {
		return ""
	}
	return b.red.String()
}

// inCluster reports whether a client address is local traffic (upstream's
// detect-local modes: a pod of the cluster CIDR, or with NodeCIDR of this
// node's pod CIDR) or the node itself. A proxied connection does not say
// which interface it came in on, so the interface modes go by the route
// back to the client: a pod behind the bridge, or behind an interface of
// the prefix, is reached through it.
func (b *Backend) inCluster(a netip.Addr) bool {
	a = a.Unmap()
	if a.IsLoopback() {
		return true
	}
	if name, prefix, ok := b.cfg.LocalInterface(); ok {
		dev, err := b.ops.routeDev(a)
		if err != nil {
			b.log.Debug("no route to a client: taken as outside the cluster", "client", a, "error", err.Error())
		} else if dev == name || prefix && strings.HasPrefix(dev, name) {
			return true
		}
	}
	for _, p := range b.cfg.LocalCIDRs() {
		if p.Contains(a) {
			return true
		}
	}
	if ips := b.nodeIPs.Load(); ips != nil {
		for _, ip := range *ips {
			if ip == a {
				return true
			}
		}
	}
	return false
}

// ensure returns key's listener, opening it on a port the kernel picks.
func (b *Backend) ensure(key proxyKey, protocol v1.Protocol) (portProxy, error) {
	if p := b.proxies[key]; p != nil {
		if _, isUDP := p.(*udpProxy); isUDP == (protocol == v1.ProtocolUDP) {
			return p, nil
		}
		p.stop() // the protocol changed
		delete(b.proxies, key)
	}
	log := b.log.With("servicePort", key.name.String(), "external", key.external)
	bal := newFamilyBalancers(b.now)
	if protocol == v1.ProtocolUDP {
		socks, err := b.ops.listenUDP()
		if err != nil {
			return nil, b.fdHint(fmt.Errorf("open a UDP listener: %w", err))
		}
		p := &udpProxy{name: key.name, socks: socks, bal: bal, b: b, log: log, idle: b.idle,
			sessions: map[netip.AddrPort]*udpSession{}}
		for _, s := range socks {
			go p.serve(s)
		}
		b.proxies[key] = p
		return p, nil
	}
	ln, err := b.ops.listenTCP()
	if err != nil {
		return nil, b.fdHint(fmt.Errorf("open a TCP listener: %w", err))
	}
	p := &tcpProxy{name: key.name, ln: ln, bal: bal, b: b, log: log, close: make(chan struct{})}
	go p.serve()
	b.proxies[key] = p
	return p, nil
}

// expireLoop forgets stale affinity entries until ctx ends.
func (b *Backend) expireLoop(ctx context.Context) {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		b.mu.Lock()
		for _, p := range b.proxies {
			p.balancers().expire()
		}
		b.mu.Unlock()
	}
}

// Cleanup removes the redirects, whichever way they were written: the
// kp-userspace tables and the KP-USERSPACE- chains of both iptables
// flavors (the listeners die with the process, or with Shutdown after a
// switch's drain). From here on the listeners open no new UDP session: with
// the rules gone nothing refuses a datagram sent straight to a listener.
func (b *Backend) Cleanup(ctx context.Context) error {
	b.rulesRemoved.Store(true)
	defer b.RulesRemoved()
	var errs []error
	if err := cleanupNFT(&b.ops); err != nil {
		errs = append(errs, fmt.Errorf("nftables: %w", err))
	}
	if err := cleanupIPTables(ctx, &b.ops, b.log); err != nil {
		errs = append(errs, fmt.Errorf("iptables: %w", err))
	}
	return errors.Join(errs...)
}

// RulesRemoved implements proxy.Drainer: the redirect rules are gone (a
// switch away removed them, or Cleanup), so no new UDP session opens and
// the open flows are handed over to the next mode (handover.go).
func (b *Backend) RulesRemoved() {
	b.rulesRemoved.Store(true)
	if err := b.startHandover(); err != nil {
		// The conntrack cleaner deletes the entries at Shutdown instead:
		// a request with an endpoint then may lose its answer.
		b.log.Warn("userspace drain: cannot hand over the UDP flows", "err", err)
	}
}

// Shutdown stops accepting (listeners closed, so new connections to the
// Services are refused), lets open connections finish until ctx ends,
// then closes the rest. The redirect table stays, as the other modes' rules
// stay when kp stops: a restarted kp takes over without a gap.
func (b *Backend) Shutdown(ctx context.Context) error {
	b.handOverAll()
	b.mu.Lock()
	b.down = true
	for key, p := range b.proxies {
		p.stop()
		delete(b.proxies, key)
	}
	b.mu.Unlock()
	open := b.conns.len()
	if open > 0 {
		b.log.Info("userspace proxy draining", "sockets", open)
	}
	if n := b.conns.drain(ctx); n > 0 {
		b.log.Warn("userspace proxy closed connections still open at the shutdown bound", "sockets", n)
		return fmt.Errorf("closed %d sockets still open at the shutdown bound", n)
	}
	return nil
}

// EndpointCounters implements proxy.CounterReporter: per endpoint, the
// connections (TCP) and sessions (UDP) the proxy opened to it, and the
// bytes it copied both ways (counted when a connection ends).
func (b *Backend) EndpointCounters(s *proxy.State) (map[proxy.EndpointRef]proxy.EndpointCounter, error) {
	return b.stats.snapshot(s), nil
}

// ActiveConnections returns, per endpoint with some, the connections and
// sessions open now.
func (b *Backend) ActiveConnections() map[proxy.EndpointRef]int64 { return b.stats.activeConns() }

// NodePortScope implements proxy.NodePortScoper: --nodeport-addresses as
// this mode was given it.
func (b *Backend) NodePortScope() ([]netip.Prefix, bool) {
	return b.cfg.NodePortAddresses, b.cfg.NodePortPrimary
}
