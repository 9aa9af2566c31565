package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	discoveryinformers "k8s.io/client-go/informers/discovery/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
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
func NewKubeClient(kubeconfig, master string) (kubernetes.Interface, error) {
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
	cfg.UserAgent = "kp"
	// Informers list once and then watch, so these only matter for the
	// initial lists after a start or a long disconnection.
	cfg.QPS = 50
	cfg.Burst = 100
	// Core types have protobuf encodings: cheaper to decode than JSON for
	// the thousands of Services and slices a large cluster has.
	cfg.ContentType = runtime.ContentTypeProtobuf
	cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("API client for %s: %w", cfg.Host, err)
	}
	return client, nil
}

// KubeSource is the API server source: shared informers for Services,
// EndpointSlices and the proxy's own Node.
type KubeSource struct {
	client   kubernetes.Interface
	nodeName string
	resync   time.Duration
	log      *slog.Logger

	waitLogInterval  time.Duration
	errorLogInterval time.Duration
	// probe asks the API server whether it answers at all. client-go's
	// reflectors retry a refused connection without reporting it, so
	// without a probe kp could say it waits but not why, and would say
	// nothing when the API server goes away after the first sync.
	probe func(context.Context) error
	// transform compacts every object before the informers store it
	// (transformObjects; nil stores them as listed, for the benchmark).
	transform cache.TransformFunc
}

var _ Source = (*KubeSource)(nil)

// NewKubeSource returns a source watching the API server through client.
// resync is the informers' resync period (upstream --config-sync-period; 0
// disables it).
func NewKubeSource(client kubernetes.Interface, nodeName string, resync time.Duration, log *slog.Logger) *KubeSource {
	return &KubeSource{
		client:           client,
		nodeName:         nodeName,
		resync:           resync,
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
// waiting at most timeout. Fake clientsets have no REST client: they always
// answer.
func probeAPIServer(client kubernetes.Interface, timeout time.Duration) func(context.Context) error {
	return func(ctx context.Context) error {
		rc := client.Discovery().RESTClient()
		if rc == nil {
			return nil
		}
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		return rc.Get().AbsPath("/version").Do(ctx).Error()
	}
}

// serviceSelector selects the Services a node proxy handles: every one not
// handed to another proxy. The API server filters, as for upstream
// kube-proxy, so other proxies' objects never reach kp.
func serviceSelector() labels.Selector {
	noProxyName, err := labels.NewRequirement(LabelServiceProxyName, selection.DoesNotExist, nil)
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

// Run starts the informers, waits until every cache has synced and its
// initial objects reached the sink, reports OnSynced, and keeps delivering
// changes until ctx is done. API errors are never fatal: client-go retries
// them for as long as it takes, and Run says what it is waiting for.
func (k *KubeSource) Run(ctx context.Context, sink Sink) error {
	if k.nodeName == "" {
		return errors.New("kube source: no node name (kp uses the hostname unless --hostname-override is set)")
	}
	svcSel, sliceSel := serviceSelector(), endpointSliceSelector()
	factory := informers.NewSharedInformerFactory(k.client, k.resync)
	svcInformer := factory.InformerFor(&v1.Service{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return coreinformers.NewFilteredServiceInformer(c, metav1.NamespaceAll, resync, cache.Indexers{},
			func(o *metav1.ListOptions) { o.LabelSelector = svcSel.String() })
	})
	sliceInformer := factory.InformerFor(&discovery.EndpointSlice{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return discoveryinformers.NewFilteredEndpointSliceInformer(c, metav1.NamespaceAll, resync, cache.Indexers{},
			func(o *metav1.ListOptions) { o.LabelSelector = sliceSel.String() })
	})
	nodeFactory := informers.NewSharedInformerFactoryWithOptions(k.client, k.resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector(metav1.ObjectNameField, k.nodeName).String()
		}))
	nodeInformer := nodeFactory.Core().V1().Nodes().Informer()

	handlers := []struct {
		kind     string
		informer cache.SharedIndexInformer
		handler  cache.ResourceEventHandler
	}{
		{"Service", svcInformer, k.serviceHandler(sink, svcSel)},
		{"EndpointSlice", sliceInformer, k.endpointSliceHandler(sink, sliceSel)},
		{"Node", nodeInformer, k.nodeHandler(sink)},
	}
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
	inf, h, err := k.serviceCIDRInformer(ctx, factory, sink, status)
	if err != nil {
		return nil // ctx done before the API server answered: not a failure
	}
	if inf != nil {
		handlers = append(handlers, struct {
			kind     string
			informer cache.SharedIndexInformer
			handler  cache.ResourceEventHandler
		}{"ServiceCIDR", inf, h})
	}
	var synced []cache.InformerSynced
	for _, h := range handlers {
		if k.transform != nil {
			if err := h.informer.SetTransform(k.transform); err != nil {
				return fmt.Errorf("%s informer: %w", h.kind, err)
			}
		}
		if err := h.informer.SetWatchErrorHandlerWithContext(status.watchError(h.kind)); err != nil {
			return fmt.Errorf("%s informer: %w", h.kind, err)
		}
		reg, err := h.informer.AddEventHandler(h.handler)
		if err != nil {
			return fmt.Errorf("%s informer: %w", h.kind, err)
		}
		// The registration has synced once the handler, not just the
		// cache, has seen every initial object.
		synced = append(synced, reg.HasSynced)
	}
	factory.Start(ctx.Done())
	nodeFactory.Start(ctx.Done())
	defer k.shutdown(factory, nodeFactory)

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

// informerShutdownTimeout bounds how long stopping waits for the informers.
const informerShutdownTimeout = 5 * time.Second

// shutdown stops the informer factories, waiting at most
// informerShutdownTimeout: a list request to an API server that accepted the
// connection and never answers is not cancelled by client-go, and must not
// keep kp from exiting on SIGTERM.
func (k *KubeSource) shutdown(factories ...informers.SharedInformerFactory) {
	done := make(chan struct{})
	go func() {
		for _, f := range factories {
			f.Shutdown()
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(informerShutdownTimeout):
		k.log.Warn("informers still waiting on the API server after " + informerShutdownTimeout.String() + "; not waiting for them")
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

func (k *KubeSource) serviceHandler(sink Sink, sel labels.Selector) cache.ResourceEventHandler {
	return &objectHandler[*v1.Service]{
		kind:    "Service",
		log:     k.log,
		matches: func(svc *v1.Service) bool { return sel.Matches(labels.Set(svc.Labels)) },
		deliver: sink.OnService,
	}
}

func (k *KubeSource) endpointSliceHandler(sink Sink, sel labels.Selector) cache.ResourceEventHandler {
	return &objectHandler[*discovery.EndpointSlice]{
		kind:    "EndpointSlice",
		log:     k.log,
		matches: func(s *discovery.EndpointSlice) bool { return sel.Matches(labels.Set(s.Labels)) },
		deliver: sink.OnEndpointSlice,
	}
}

func (k *KubeSource) nodeHandler(sink Sink) cache.ResourceEventHandler {
	return &objectHandler[*v1.Node]{
		kind:    "Node",
		log:     k.log,
		matches: func(n *v1.Node) bool { return n.Name == k.nodeName },
		deliver: func(_, name string, n *v1.Node) {
			// The field selector already limits the informer to this
			// node; checking again keeps a deletion of any other
			// Node from clearing ours.
			if name == k.nodeName {
				sink.OnNode(n)
			}
		},
	}
}

// objectHandler passes one kind's informer events to the sink. matches
// repeats the informer's server-side filter, so an object that stops
// matching on update is delivered as deleted whatever the server sends.
type objectHandler[T interface {
	*v1.Service | *discovery.EndpointSlice | *v1.Node | *networkingv1.ServiceCIDR
	metav1.Object
}] struct {
	kind    string
	log     *slog.Logger
	matches func(T) bool
	deliver func(namespace, name string, obj T) // nil obj: deleted
}

func (h *objectHandler[T]) OnAdd(obj any, _ bool) {
	o, ok := obj.(T)
	if !ok {
		h.log.Error("informer delivered an unexpected type", "kind", h.kind, "type", fmt.Sprintf("%T", obj))
		return
	}
	if h.matches(o) {
		h.deliver(o.GetNamespace(), o.GetName(), o)
	}
}

func (h *objectHandler[T]) OnUpdate(oldObj, newObj any) {
	o, ok := newObj.(T)
	if !ok {
		h.log.Error("informer delivered an unexpected type", "kind", h.kind, "type", fmt.Sprintf("%T", newObj))
		return
	}
	if h.matches(o) {
		h.deliver(o.GetNamespace(), o.GetName(), o)
		return
	}
	if old, ok := oldObj.(T); ok && h.matches(old) {
		var deleted T
		h.deliver(o.GetNamespace(), o.GetName(), deleted)
	}
}

func (h *objectHandler[T]) OnDelete(obj any) {
	var deleted T
	// A deletion the informer missed while disconnected arrives as a
	// tombstone; its Obj is the last state known, possibly stale.
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		if o, ok := tomb.Obj.(T); ok {
			h.deliver(o.GetNamespace(), o.GetName(), deleted)
			return
		}
		ns, name, err := cache.SplitMetaNamespaceKey(tomb.Key)
		if err != nil {
			h.log.Error("informer tombstone with an invalid key", "kind", h.kind, "key", tomb.Key, "error", err.Error())
			return
		}
		h.deliver(ns, name, deleted)
		return
	}
	o, ok := obj.(T)
	if !ok {
		h.log.Error("informer delivered an unexpected type", "kind", h.kind, "type", fmt.Sprintf("%T", obj))
		return
	}
	h.deliver(o.GetNamespace(), o.GetName(), deleted)
}
