package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"sync"
	"time"

	"github.com/kpproxy/kp/internal/gctune"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"
)

// Upstream kube-proxy's defaults.
const (
	DefaultSyncPeriod         = 30 * time.Second
	DefaultMinSyncPeriod      = 1 * time.Second
	DefaultHealthzBindAddress = "0.0.0.0:10256"
	DefaultMetricsBindAddress = "127.0.0.1:10249"
	// DefaultStatusSocket is kp's own: its status API, root's only.
	DefaultStatusSocket = statusapi.DefaultSocket
)

// DefaultShutdownGrace bounds how long a mode that carries connections
// itself (userspace) lets them finish after SIGTERM; within Kubernetes'
// default terminationGracePeriodSeconds (30 s).
const DefaultShutdownGrace = 20 * time.Second

// shutdownTimeout bounds how long in-flight health and metrics requests may
// delay exit.
const shutdownTimeout = 5 * time.Second

// Run is kp proxy's main loop. It starts opts.Sources, waits until all of
// them delivered their initial view, then keeps opts.Backend in sync with
// their changes through a bounded-frequency runner, telling opts.Observers
// about every successful sync, while serving what upstream kube-proxy
// serves on the network and nothing more: health checks on
// cfg.HealthzBindAddress (/healthz, /livez), metrics on
// cfg.MetricsBindAddress (/metrics, /proxyMode, /healthz; /debug/pprof/
// with cfg.Profiling); an empty address or port 0 disables a server. The
// status API (/kp/v1/...) is on the root-only Unix socket
// cfg.StatusSocket (socket.go).
//
// Run returns nil when ctx is cancelled, leaving the kernel state in place:
// a restarting proxy must not interrupt traffic (cleanup is Backend.Cleanup's
// job). It returns an error when a server cannot listen or a source fails.
func Run(ctx context.Context, cfg proxy.Config, opts RunOptions) error {
	return run(ctx, cfg, opts, clock.RealClock{})
}

func run(ctx context.Context, cfg proxy.Config, opts RunOptions, clk clock.WithTicker) error {
	backend, sources, log := opts.Backend, opts.Sources, opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	syncPeriod := cfg.SyncPeriod
	if syncPeriod <= 0 {
		syncPeriod = DefaultSyncPeriod
	}
	if cfg.MinSyncPeriod < 0 || cfg.MinSyncPeriod > syncPeriod {
		return fmt.Errorf("min sync period %s must be between 0 and the sync period %s", cfg.MinSyncPeriod, syncPeriod)
	}
	nodeName, err := proxy.NodeName(cfg.HostnameOverride)
	if err != nil {
		return err
	}

	// On return: stop the HTTP servers, cancel the sources and the runner,
	// wait for all of them, then drain the backend that was syncing
	// (defers run in reverse).
	defer drain(backend, opts.ShutdownGrace, log)
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, len(sources)+2)

	metrics, health, status, err := newObservers(cfg, backend, nodeName, syncPeriod, opts, clk)
	if err != nil {
		return err
	}
	metrics.ObserveHealth(health)
	serviceHealth := newServiceHealth(cfg, backend, health.Healthy, log)
	defer serviceHealth.Close()
	stopHTTP, err := startHTTP(ctx, &wg, errc, log, []httpServer{
		{name: "healthz", addr: cfg.HealthzBindAddress, handler: health.Handler()},
		{name: "metrics", addr: cfg.MetricsBindAddress, handler: withProfiling(cfg.Profiling, metrics.Handler())},
		{name: "status", socket: true, addr: cfg.StatusSocket, handler: socketHandler(status, opts.Inventory, nodeName)},
	})
	if err != nil {
		return err
	}
	defer stopHTTP()

	s := &syncer{backend: backend, metrics: metrics, health: health, status: status, observers: opts.Observers,
		serviceHealth: serviceHealth, clk: clk, log: log, releaseMemory: opts.releaseMemory,
		drift: &driftRepairs{log: log, metrics: metrics, clk: clk}}
	if s.releaseMemory == nil {
		s.releaseMemory = func() { go debug.FreeOSMemory() }
	}
	lowerGC := opts.lowerGC
	if lowerGC == nil {
		lowerGC = gctune.Lower
	}
	s.listsDone = sync.OnceFunc(lowerGC(gctune.InitialLists))
	defer s.listsDone()
	runner := NewRunner("sync-proxy-rules", s.sync, cfg.MinSyncPeriod, syncPeriod, clk).WithLogger(log)
	s.tracker = proxy.NewChangeTracker(proxy.ChangeTrackerOptions{
		NodeName:          nodeName,
		Log:               log,
		Sources:           len(sources),
		Clock:             clk,
		ServiceCIDRs:      cfg.ServiceCIDRs,
		IgnoreExternalIPs: cfg.IgnoreExternalIPs, // upstream's AllowServiceExternalIPs=false
		OnChange: func() {
			metrics.Queued(clk.Now())
			health.QueuedUpdate(clk.Now())
			runner.Trigger()
		},
	})
	metrics.ObserveTracker(s.tracker)
	sink := nodeHealthSink{Sink: s.tracker, health: health, nodeName: nodeName}
	for _, src := range sources {
		wg.Go(func() {
			if err := src.Run(ctx, sink); err != nil && ctx.Err() == nil {
				errc <- fmt.Errorf("source %s: %w", sourceName(src), err)
			}
		})
	}

	log.Info("waiting for sources to sync", "node", nodeName, "mode", backend.Mode(), "sources", len(sources))
	if err := waitOrFail(ctx, errc, s.tracker.WaitForSync); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return nil
	}
	log.Info("sources synced; starting sync loop", "minSyncPeriod", cfg.MinSyncPeriod, "syncPeriod", syncPeriod)
	s.runLoop(ctx, &wg, runner)

	select {
	case <-ctx.Done():
		log.Info("shutting down; kernel state is left in place")
		return nil
	case err := <-errc:
		return err
	}
}

// runLoop starts the sync loop and what may ask it for a sync of its own:
// a mode switch (proxy.Triggerable) and the backend's drift detector
// (proxy.DriftDetector).
func (s *syncer) runLoop(ctx context.Context, wg *sync.WaitGroup, runner *Runner) {
	if t, ok := s.backend.(proxy.Triggerable); ok {
		t.SetTrigger(runner.Trigger) // a mode switch asked for runs at the next sync
	}
	wg.Go(func() { runner.Run(ctx) })
	if d, ok := s.backend.(proxy.DriftDetector); ok {
		wg.Go(func() { s.drift.watch(ctx, d, s.backend.Mode, runner.Trigger) })
	}
}

// waitOrFail waits for wait, unless a background task fails first. A
// cancelled ctx is a normal shutdown.
func waitOrFail(ctx context.Context, errc <-chan error, wait func(context.Context) error) error {
	done := make(chan error, 1)
	go func() { done <- wait(ctx) }()
	select {
	case err := <-errc:
		return err
	case <-done:
		return nil // either synced, or ctx done: the caller's select sees which
	}
}

// syncer is one run of the runner: snapshot, backend sync, bookkeeping.
type syncer struct {
	tracker *proxy.ChangeTracker
	backend proxy.Backend
	metrics *Metrics
	health  *Health
	clk     clock.PassiveClock
	log     *slog.Logger
	// status records outcomes for the status API; observers and prev (the
	// last State synced) are for the SyncObservers.
	status    *Status
	observers []proxy.SyncObserver
	prev      *proxy.State

	// serviceHealth serves healthCheckNodePorts from each synced State.
	serviceHealth *ServiceHealthServer
	// drift holds the changes of kp's rules by others that the next sync
	// repairs.
	drift *driftRepairs

	// releaseMemory gives a full sync's garbage back (RunOptions);
	// listsDone puts back GOGC as it was before the initial lists (once,
	// when the first sync starts: the backend sets its own for a full
	// sync).
	releaseMemory func()
	listsDone     func()

	lastFailed bool
	// triggers keeps the trigger times of snapshots whose sync failed, so
	// the programming latency is measured when the change finally lands.
	triggers map[proxy.ServicePortName]time.Time
}

func (s *syncer) sync(ctx context.Context) error {
	st := s.tracker.Snapshot()
	if s.triggers == nil {
		s.triggers = make(map[proxy.ServicePortName]time.Time)
	}
	for name, t := range st.TriggerTimes {
		if cur, ok := s.triggers[name]; !ok || t.Before(cur) {
			s.triggers[name] = t
		}
	}
	s.listsDone()
	drifts, driftSince := s.drift.take()
	start := s.clk.Now()
	err := s.backend.Sync(ctx, st)
	end := s.clk.Now()
	if err != nil {
		s.drift.failed(drifts, driftSince)
		s.lastFailed = true
		s.metrics.SyncFailed()
		err = fmt.Errorf("sync %s generation %d (%d service ports changed): %w",
			s.backend.Mode(), st.Generation, len(st.Changed), err)
		s.status.Failed(end, err)
		return err
	}
	full := s.lastFailed || st.Generation == 1
	if r, ok := s.backend.(proxy.FullSyncReporter); ok {
		full = r.LastSyncFull()
	}
	s.lastFailed = false
	s.drift.synced(drifts, driftSince, end, s.backend.Mode())
	s.metrics.SyncSucceeded(end.Sub(start), full, end)
	s.metrics.Programmed(s.triggers, end)
	clear(s.triggers)
	s.health.Updated(end)
	s.status.Succeeded(st, start, end, full)
	s.metrics.ObserveState(st)
	s.serviceHealth.Sync(st)
	s.log.Debug("synced", "generation", st.Generation, "servicePorts", len(st.Services),
		"changed", len(st.Changed), "nodeChanged", st.NodeChanged, "full", full, "duration", end.Sub(start))
	for _, o := range s.observers {
		o.Synced(ctx, s.prev, st)
	}
	s.prev = st
	if full {
		// A full sync's garbage is the size of the whole ruleset, many
		// times what kp keeps: give it back now rather than keep it until
		// the runtime's scavenger gets to it. Here, once the backend's Sync
		// has returned: from inside it, the transaction it was applying
		// was still reachable, and the collection kept ~8 MB more of a
		// 10,000-Service sync's heap in use. In the background: a forced
		// collection takes a while at 10,000s of Services.
		s.releaseMemory()
	}
	return nil
}

// nodeHealthSink passes the proxy's own Node to Health as well, for
// /healthz's node eligibility.
type nodeHealthSink struct {
	proxy.Sink
	health   *Health
	nodeName string
}

var _ proxy.Batcher = nodeHealthSink{}

// Batch passes a source's batch on to the tracker.
func (n nodeHealthSink) Batch(fn func()) { proxy.Batch(n.Sink, fn) }

func (n nodeHealthSink) OnNode(node *v1.Node) {
	if node == nil || node.Name == n.nodeName {
		n.health.SyncNode(node)
	}
	n.Sink.OnNode(node)
}

func sourceName(src proxy.Source) string {
	if s, ok := src.(fmt.Stringer); ok {
		return s.String()
	}
	return fmt.Sprintf("%T", src)
}

type httpServer struct {
	name    string
	addr    string
	socket  bool // addr is a Unix socket's path
	handler http.Handler
}

// startHTTP listens on every enabled server's address before returning, so
// that a port in use fails the start with a clear error, then serves in the
// background. The returned func shuts them down gracefully.
func startHTTP(ctx context.Context, wg *sync.WaitGroup, errc chan<- error, log *slog.Logger, servers []httpServer) (func(), error) {
	var running []*http.Server
	stop := func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
		defer cancel()
		for _, srv := range running {
			_ = srv.Shutdown(sctx)
		}
	}
	for _, s := range servers {
		listenFn := listen
		if s.socket {
			listenFn = func(_, path string) (net.Listener, error) { return listenSocket(path) }
		}
		ln, err := listenFn(s.name, s.addr)
		if err != nil {
			stop()
			return nil, err
		}
		if ln == nil {
			log.Info("server disabled", "server", s.name)
			continue
		}
		srv := &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second}
		running = append(running, srv)
		log.Info("serving", "server", s.name, "address", ln.Addr().String())
		wg.Go(func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("%s server on %s: %w", s.name, s.addr, err)
			}
		})
	}
	return stop, nil
}

// listen returns nil, nil for a disabled server (empty address or port 0).
func listen(name, addr string) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("%s bind address %q: want host:port: %w", name, addr, err)
	}
	if port == "0" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s server: %w", name, err)
	}
	return ln, nil
}

// drain lets a backend that carries connections itself finish them: it
// stops accepting and waits at most grace. The backend is the one Run
// synced, so after a mode switch it is the mode that runs now.
func drain(backend proxy.Backend, grace time.Duration, log *slog.Logger) {
	d, ok := backend.(proxy.Shutdowner)
	if !ok {
		return
	}
	if grace <= 0 {
		grace = DefaultShutdownGrace
	}
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := d.Shutdown(ctx); err != nil {
		log.Warn("shutdown", "err", err)
	}
}

// newObservers builds what watches the sync loop: its metrics (with the
// collectors opts adds), the health it reports on /healthz, and the status
// API's record.
func newObservers(cfg proxy.Config, backend proxy.Backend, nodeName string, syncPeriod time.Duration, opts RunOptions, clk clock.WithTicker) (*Metrics, *Health, *Status, error) {
	metrics := NewMetrics(backend.Mode())
	metrics.FollowMode(backend.Mode)
	build := runningBuild(opts.Build)
	if err := metrics.Registry().Register(buildInfo(build)); err != nil {
		return nil, nil, nil, fmt.Errorf("register metrics: %w", err)
	}
	health := NewHealth(2*syncPeriod, clk)
	status := NewStatus(backend, nodeName, health, clk)
	status.SetSysctls(opts.Sysctls)
	status.SetModeChoice(opts.ModeChoice)
	status.SetBuild(build)
	status.SetSnapshot(cfg, opts.SnapshotFacts)
	for _, c := range opts.Collectors {
		if err := metrics.Registry().Register(c); err != nil {
			return nil, nil, nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	return metrics, health, status, nil
}

// newServiceHealth serves the healthCheckNodePorts where the running mode
// answers NodePorts: its --nodeport-addresses (proxy.NodePortScoper, which
// follows a switch), else cfg's.
func newServiceHealth(cfg proxy.Config, backend proxy.Backend, healthy func() bool, log *slog.Logger) *ServiceHealthServer {
	o := ServiceHealthOptions{Log: log, Healthy: healthy,
		NodePortAddresses: cfg.NodePortAddresses, NodePortPrimary: cfg.NodePortPrimary}
	if sc, ok := backend.(proxy.NodePortScoper); ok {
		o.NodePortScope = sc.NodePortScope
	}
	return NewServiceHealthServer(o)
}
