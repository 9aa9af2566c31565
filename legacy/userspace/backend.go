package userspace

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/nftables"
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

	// mu guards the proxies, which Sync changes and Shutdown stops.
	mu       sync.Mutex
	proxies  map[proxyKey]portProxy
	down     bool
	expiring bool // the affinity expiry loop runs
	// refused are the service ports the last sync gave no listener, for
	// want of file descriptors (fdbudget.go), sorted.
	refused []proxy.ServicePortName
	// lastRules is what kp last wrote, per family; a family missing is
	// unknown (start, after a failed write) and written by the next sync.
	lastRules map[proxy.Family]Rules
	lastWrite time.Time // when both families were last written
	// last is each service port's listener ports and usability as the
	// last successful sync left them; nil after a failure (the next sync
	// looks at every service port).
	last map[proxy.ServicePortName]portState
}

// portState is what a service port contributes to the redirect rules.
type portState struct {
	ports  listenerPorts
	usable bool
	// dropInternal: internalTrafficPolicy Local, and no endpoint on this
	// node: its ClusterIPs' traffic is dropped, as upstream does, not
	// accepted by the listener and held.
	dropInternal bool
	sp           *proxy.ServicePort // its addresses, ports and source ranges
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
		stats: newStats(), conns: newConnSet(), proxies: map[proxyKey]portProxy{}}
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

// Sync makes the listeners and the redirect table match s. Every sync is
// full: listeners are kept by name, their endpoints replaced, and the
// table rewritten in one transaction per family.
func (b *Backend) Sync(ctx context.Context, s *proxy.State) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.down {
		return errors.New("the userspace proxy is shutting down")
	}
	if b.red == nil {
		return errors.New("the userspace proxy was not probed: no redirect method chosen")
	}
	if !b.expiring {
		b.expiring = true
		go b.expireLoop(ctx)
	}
	nodeIPs := slices.Clone(s.Node.IPs)
	b.nodeIPs.Store(&nodeIPs)
	ports := map[proxy.ServicePortName]listenerPorts{}
	usable := map[proxy.ServicePortName]bool{}
	dropInternal := map[proxy.ServicePortName]bool{}
	want := map[proxyKey]bool{}
	keep := map[proxy.EndpointRef]bool{}
	var errs []error
	// After a successful sync only s.Changed needs a look (unless the Node
	// changed: topology and local endpoints); the others keep their
	// listeners and balancers as they are.
	incremental := b.last != nil && !s.NodeChanged
	rulesSame := incremental && !s.ServiceCIDRsChanged
	// Service ports that keep their listeners are counted first, so a new
	// one never takes the descriptors of one that works; then new
	// listeners open in name order, as the budget allows (fdbudget.go).
	rl := b.noFile()
	b.setLimits(rl)
	budget, budgeted := listenerBudget(rl.cur)
	used := 0
	var pending, refused []proxy.ServicePortName
	for name, sp := range s.Services {
		if sp.Protocol != v1.ProtocolTCP && sp.Protocol != v1.ProtocolUDP {
			continue // SCTP: not proxied (Go has no SCTP sockets)
		}
		for _, e := range s.Endpoints[name] {
			keep[ref(name, e.AddrPort())] = true
		}
		have, _ := b.held(name, sp)
		used += have
		if _, changed := s.Changed[name]; incremental && !changed {
			if ps, ok := b.last[name]; ok {
				ports[name], usable[name], dropInternal[name] = ps.ports, ps.usable, ps.dropInternal
				for _, key := range listenerKeys(name, sp) {
					want[key] = true
				}
				continue
			}
		}
		pending = append(pending, name)
	}
	slices.SortFunc(pending, compareNames)
	for _, name := range pending {
		sp := s.Services[name]
		_, need := b.held(name, sp)
		if budgeted && used+need > budget {
			// Refused: rejected as a service port without endpoints, so
			// clients fail at once; not in b.last, so retried next sync.
			refused = append(refused, name)
			ports[name], usable[name] = listenerPorts{}, false
			continue
		}
		used += need
		eps := s.Endpoints[name]
		var lp listenerPorts
		ok := true
		for _, key := range listenerKeys(name, sp) {
			p, err := b.ensure(key, sp.Protocol)
			if err != nil {
				errs = append(errs, fmt.Errorf("service port %s: %w", name, err))
				ok = false
				break
			}
			want[key] = true
			b.update(p, sp, eps, s.Node, key.external)
			if key.external {
				lp.external = p.port()
			} else {
				lp.internal = p.port()
			}
		}
		if !ok {
			continue
		}
		ports[name] = lp
		local := false
		for _, f := range []proxy.Family{proxy.IPv4, proxy.IPv6} {
			sel := proxy.SelectEndpoints(sp, proxy.FilterEndpoints(f, eps), s.Node)
			usable[name] = usable[name] || sel.Usable
			local = local || len(sel.Local) > 0
		}
		dropInternal[name] = sp.InternalPolicyLocal && usable[name] && !local
	}
	rulesSame = rulesSame && !b.listeningAgain(ports) && !b.rulesChanged(s, ports, usable, dropInternal)
	if rulesSame && len(b.lastRules) == len(b.red.families()) && b.now().Sub(b.lastWrite) < rewriteInterval {
		// Nothing to write.
	} else if err := b.writeRules(ctx, s, ports, usable, dropInternal); err != nil {
		errs = append(errs, err)
	}
	// Listeners of service ports that are gone close after the rules no
	// longer send traffic to them; their open connections run on.
	for key, p := range b.proxies {
		if !want[key] {
			p.stop()
			delete(b.proxies, key)
		}
	}
	b.stats.forget(keep)
	var sockets int
	for _, p := range b.proxies {
		sockets += p.sockets()
	}
	b.listenerSockets.Store(int64(sockets))
	if budgeted {
		b.stats.listenerBudget.Set(float64(budget))
	}
	b.reportRefused(refused, rl, budget)
	// Refused service ports do not fail the sync: the others are
	// programmed, and a failing sync would keep /healthz and /livez failing
	// until the kubelet restarts kp (dropping every proxied connection),
	// for as long as the Services are there. They are reported by the log,
	// kp_userspace_refused_service_ports and Refused, and retried.
	if len(errs) > 0 {
		b.last = nil
		return errors.Join(errs...)
	}
	b.last = make(map[proxy.ServicePortName]portState, len(ports))
	for name, lp := range ports {
		if lp == (listenerPorts{}) {
			continue // refused
		}
		b.last[name] = portState{ports: lp, usable: usable[name], dropInternal: dropInternal[name], sp: s.Services[name]}
	}
	return nil
}

// rulesChanged reports whether a changed service port's rules differ from
// the last sync's. The rules change only with a service port's Service
// (addresses, ports, source ranges), listener ports or usability, or a
// service port coming or going: endpoint changes, the most common, leave
// them.
func (b *Backend) rulesChanged(s *proxy.State, ports map[proxy.ServicePortName]listenerPorts, usable, dropInternal map[proxy.ServicePortName]bool) bool {
	for name := range s.Changed {
		old, had := b.last[name]
		lp, has := ports[name]
		if had != has || old.ports != lp || old.usable != usable[name] || old.dropInternal != dropInternal[name] ||
			has && !reflect.DeepEqual(old.sp, s.Services[name]) {
			return true
		}
	}
	return false
}

// update gives p the endpoints its traffic may use: SelectEndpoints per
// family, the Local list for traffic under a Local policy.
func (b *Backend) update(p portProxy, sp *proxy.ServicePort, eps []proxy.Endpoint, node proxy.Node, external bool) {
	local := sp.InternalPolicyLocal
	if external {
		local = sp.ExternalPolicyLocal
	}
	bal := p.balancers()
	split := external && local
	valid := map[netip.AddrPort]bool{}
	set := func(target *balancer, list []proxy.Endpoint) {
		aps := make([]netip.AddrPort, 0, len(list))
		for _, e := range list {
			aps = append(aps, e.AddrPort())
			valid[e.AddrPort()] = true
		}
		target.update(aps, sp.AffinityTimeout)
	}
	for _, f := range []proxy.Family{proxy.IPv4, proxy.IPv6} {
		sel := proxy.SelectEndpoints(sp, proxy.FilterEndpoints(f, eps), node)
		list := sel.Cluster
		if local {
			list = sel.Local
		}
		set(bal.of(familyAddr(f)), list)
		if split {
			set(bal.clusterOf(familyAddr(f)), sel.Cluster)
		} else {
			bal.clusterOf(familyAddr(f)).update(nil, 0)
		}
	}
	bal.split.Store(split)
	if u, ok := p.(*udpProxy); ok {
		u.prune(valid)
	}
}

// familyAddr is an address of family f (to choose a family's balancer).
func familyAddr(f proxy.Family) netip.Addr {
	if f == proxy.IPv6 {
		return netip.IPv6Unspecified()
	}
	return netip.IPv4Unspecified()
}

// inCluster reports whether a client address is inside the cluster: a
// pod (--cluster-cidr) or the node itself.
func (b *Backend) inCluster(a netip.Addr) bool {
	a = a.Unmap()
	if a.IsLoopback() {
		return true
	}
	for _, p := range b.cfg.ClusterCIDRs {
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
// flavors (the listeners die with the process).
func (b *Backend) Cleanup(ctx context.Context) error {
	var errs []error
	if err := cleanupNFT(&b.ops); err != nil {
		errs = append(errs, fmt.Errorf("nftables: %w", err))
	}
	if err := cleanupIPTables(ctx, &b.ops, b.log); err != nil {
		errs = append(errs, fmt.Errorf("iptables: %w", err))
	}
	return errors.Join(errs...)
}

// Shutdown stops accepting (listeners closed, so new connections to the
// Services are refused), lets open connections finish until ctx ends,
// then closes the rest. The redirect table stays, as the other modes' rules
// stay when kp stops: a restarted kp takes over without a gap.
func (b *Backend) Shutdown(ctx context.Context) error {
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

// netOps opens sockets and netlink connections: in the process's network
// namespace, or (tests) in another.
type netOps struct {
	listenTCP func() (*net.TCPListener, error)
	listenUDP func() ([]*net.UDPConn, error)
	dial      func(ctx context.Context, network, addr string) (net.Conn, error)
	nft       func(opts ...nftables.ConnOption) (*nftables.Conn, error)
	// inNS runs fn in the namespace (iptables binaries run in the calling
	// thread's).
	inNS func(fn func() error) error
}
