package source

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kpproxy/kp/internal/kubeclient"
	"github.com/kpproxy/kp/proxy"
)

const (
	// kubeWaitLogInterval is how often kp says it is still waiting for the
	// API server before its caches first sync.
	kubeWaitLogInterval = 10 * time.Second
	// kubeErrorLogInterval rate-limits list/watch error logs once synced;
	// client-go retries with backoff and would otherwise log every retry.
	kubeErrorLogInterval = 30 * time.Second
)

// NewKubeClient builds a client for the API server: from the kubeconfig file
// and/or master URL (master overrides the kubeconfig's server, as upstream
// kube-proxy's --master does), or from the in-cluster service account when
// both are empty.
func NewKubeClient(kubeconfig, master string) (kubeclient.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" && master == "" {
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster API config (give --kubeconfig or --master when not running in a pod): %w", err)
		}
	} else {
		cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig},
			&clientcmd.ConfigOverrides{ClusterInfo: clientcmdapi.Cluster{Server: master}},
		).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("API config from kubeconfig %q, master %q: %w", kubeconfig, master, err)
		}
	}
	return KubeClientFor(cfg)
}

// KubeClientFor is kp's API client over cfg, with kp's user agent, rates
// and content type.
func KubeClientFor(cfg *rest.Config) (kubeclient.Interface, error) {
	c := *cfg
	c.UserAgent = "kp"
	// The source lists once and then watches, so these only matter for the
	// initial lists after a start or a long disconnection.
	c.QPS = 50
	c.Burst = 100
	// Core types have protobuf encodings: cheaper to decode than JSON for
	// the thousands of Services and slices a large cluster has.
	c.ContentType = runtime.ContentTypeProtobuf
	c.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	return kubeclient.New(&c)
}

// KubeSource is the API server source: a list/watch each for Services,
// EndpointSlices, the proxy's own Node and ServiceCIDRs, delivering
// straight to the sink (see keyStore: no informer cache).
type KubeSource struct {
	client   kubeclient.Interface
	nodeName string
	log      *slog.Logger

	waitLogInterval  time.Duration
	errorLogInterval time.Duration
	// probe asks the API server whether it answers at all. client-go's
	// reflectors retry a refused connection without reporting it, so
	// without a probe kp could say it waits but not why, and would say
	// nothing when the API server goes away after the first sync.
	probe func(context.Context) error
	// transform compacts every object while client-go's queue holds it
	// (transformObjects; nil keeps them as listed, for the benchmark).
	transform cache.TransformFunc
}

var _ proxy.Source = (*KubeSource)(nil)

// NewKubeSource returns a source watching the API server through client.
// configSyncPeriod (upstream --config-sync-period, the informers' resync
// period) is accepted and has no effect: a resync re-delivers the cached
// objects unchanged, which the change tracker skips by resourceVersion, and
// kp keeps no cache to re-deliver from. Missed deletions are found by the
// reflector's relist, as before.
func NewKubeSource(client kubeclient.Interface, nodeName string, configSyncPeriod time.Duration, log *slog.Logger) *KubeSource {
	_ = configSyncPeriod
	return &KubeSource{
		client:           client,
		nodeName:         nodeName,
		log:              log.With("source", "kube"),
		waitLogInterval:  kubeWaitLogInterval,
		errorLogInterval: kubeErrorLogInterval,
		probe:            probeAPIServer(client, apiProbeTimeout),
		transform:        transformObjects,
	}
}

// apiProbeTimeout bounds one reachability probe: an API server behind a
// black-holing network must not stall the log line that reports it.
const apiProbeTimeout = 5 * time.Second

// probeAPIServer GETs /version, which every authenticated client may read,
// waiting at most timeout.
func probeAPIServer(client kubeclient.Interface, timeout time.Duration) func(context.Context) error {
	return func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		return client.Discovery().ServerVersion(ctx)
	}
}

// serviceSelector selects the Services a node proxy handles: every one not
// handed to another proxy. The API server filters, as for upstream
// kube-proxy, so other proxies' objects never reach kp.
func serviceSelector() labels.Selector {
	noProxyName, err := labels.NewRequirement(proxy.LabelServiceProxyName, selection.DoesNotExist, nil)
	if err != nil {
		panic(err) // a constant, valid label key
	}
	return labels.NewSelector().Add(*noProxyName)
}

// endpointSliceSelector also leaves out headless Services' slices: they have
// no cluster IP to forward from.
func endpointSliceSelector() labels.Selector {
	noHeadless, err := labels.NewRequirement(v1.IsHeadlessService, selection.DoesNotExist, nil)
	if err != nil {
		panic(err) // a constant, valid label key
	}
	return serviceSelector().Add(*noHeadless)
}

// Run lists and watches Services, EndpointSlices, the proxy's own Node
// and, when served, ServiceCIDRs, each through a client-go reflector over a
// keyStore (no informer cache), waits until every initial object reached
// the sink, reports OnSynced, and keeps delivering changes until ctx is
// done. API errors are never fatal: client-go retries them for as long as
// it takes, and Run says what it is waiting for.
func (k *KubeSource) Run(ctx context.Context, sink proxy.Sink) error {
	if k.nodeName == "" {
		return errors.New("kube source: no node name (kp uses the hostname unless --hostname-override is set)")
	}
	watches := []kindWatch{k.serviceWatch(sink), k.endpointSliceWatch(sink), k.nodeWatch(sink)}
	status := &apiStatus{log: k.log, interval: k.errorLogInterval}
	waitDone := make(chan struct{})
	go k.logWaiting(ctx, waitDone, status)
	defer func() {
		select {
		case <-waitDone:
		default:
			close(waitDone)
		}
	}()
	served, err := k.servesServiceCIDRs(ctx, status)
	if err != nil {
		return nil // ctx done before the API server answered: not a failure
	}
	if served {
		watches = append(watches, k.serviceCIDRWatch(sink))
	}
	runCtx, stop := context.WithCancel(ctx)
	var running sync.WaitGroup
	synced := make([]cache.InformerSynced, 0, len(watches))
	for _, w := range watches {
		ctl := cache.New(&cache.Config{
			Queue:                        newStreamQueue(w, k.transform, k.log),
			ListerWatcher:                w.lw,
			ObjectType:                   w.object,
			ObjectDescription:            w.kind,
			Process:                      w.process,
			WatchErrorHandlerWithContext: status.watchError(w.kind),
		})
		running.Go(func() { ctl.RunWithContext(runCtx) })
		// The queue has synced once the first list's objects, not just
		// listed, have all been through process and reached the sink.
		synced = append(synced, ctl.HasSynced)
	}
	defer k.shutdown(stop, &running)

	ok := cache.WaitForCacheSync(ctx.Done(), synced...)
	close(waitDone)
	if !ok {
		return nil // ctx done before the first sync: not a failure
	}
	status.setSynced()
	k.log.Info("caches synced", "node", k.nodeName)
	sink.OnSynced()
	k.watchReachability(ctx)
	return nil
}

// watchReachability says, until ctx is done, when the API server stops
// answering and when it answers again (probing every errorLogInterval).
// Nothing else changes: the kernel keeps its last state, and the informers
// resume their watches by themselves.
func (k *KubeSource) watchReachability(ctx context.Context) {
	t := time.NewTicker(k.errorLogInterval)
	defer t.Stop()
	var down time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := k.probe(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && down.IsZero():
			down = time.Now()
			k.log.Warn("API server unreachable; the kernel keeps its last state and changes resume when it answers",
				"error", err.Error())
		case err == nil && !down.IsZero():
			k.log.Info("API server reachable again", "unreachableFor", time.Since(down).Round(time.Second).String())
			down = time.Time{}
		}
	}
}

// informerShutdownTimeout bounds how long stopping waits for the watches.
const informerShutdownTimeout = 5 * time.Second

// shutdown stops the watches, waiting at most informerShutdownTimeout: a
// request to an API server that accepted the connection and never answers
// must not keep kp from exiting on SIGTERM.
func (k *KubeSource) shutdown(stop context.CancelFunc, running *sync.WaitGroup) {
	stop()
	done := make(chan struct{})
	go func() {
		running.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(informerShutdownTimeout):
		k.log.Warn("list/watch requests still waiting on the API server after " + informerShutdownTimeout.String() + "; not waiting for them")
	}
}

// logWaiting says, every waitLogInterval until done, that kp is still waiting
// for the API server, with the last error client-go met.
func (k *KubeSource) logWaiting(ctx context.Context, done <-chan struct{}, status *apiStatus) {
	t := time.NewTicker(k.waitLogInterval)
	defer t.Stop()
	start := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-done:
			return
		case <-t.C:
			attrs := []any{"waited", time.Since(start).Round(time.Second).String()}
			if err := k.probe(ctx); err != nil {
				attrs = append(attrs, "error", err.Error())
			} else if err := status.lastError(); err != "" {
				attrs = append(attrs, "error", err)
			}
			k.log.Warn("waiting for the API server; no sync until Services, EndpointSlices and the Node are listed", attrs...)
		}
	}
}

// apiStatus collects list/watch errors from the informers. Before the first
// sync they are reported by logWaiting; after it, at most once per interval.
type apiStatus struct {
	log      *slog.Logger
	interval time.Duration

	mu         sync.Mutex
	synced     bool
	last       string
	lastLogged time.Time
	suppressed int
}

func (s *apiStatus) setSynced() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.synced = true
}

func (s *apiStatus) lastError() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

func (s *apiStatus) watchError(kind string) cache.WatchErrorHandlerWithContext {
	return func(_ context.Context, _ *cache.Reflector, err error) {
		s.record("list/watch "+kind, err)
	}
}

// record notes err from what (a list/watch, a discovery request) and, once
// synced, logs it at most once per interval.
func (s *apiStatus) record(what string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = fmt.Sprintf("%s: %v", what, err)
	if !s.synced {
		return
	}
	if now := time.Now(); now.Sub(s.lastLogged) >= s.interval {
		s.log.Warn("API server error; retrying", "request", what, "error", err.Error(), "suppressed", s.suppressed)
		s.lastLogged, s.suppressed = now, 0
		return
	}
	s.suppressed++
}
