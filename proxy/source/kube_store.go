package source

import (
	"fmt"
	"log/slog"
	"sync"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// kubeObject is a kind the kube source watches.
type kubeObject interface {
	*v1.Service | *discovery.EndpointSlice | *v1.Node | *networkingv1.ServiceCIDR
	metav1.Object
}

// keyStore is what the kube source keeps of one kind in place of an
// informer's cache: the key and resourceVersion of every object it
// delivered, and nothing of the object. The change tracker already keeps
// its own compact form of each; a second copy in client-go's cache served
// only resync (which re-delivers versions the tracker skips) and the relist
// diff, which needs the keys alone. At 10,000 Services of 10 endpoints the
// cache held about 41 MB after the transforms; this holds about 2.
//
// It is the KnownObjects of a client-go RealFIFO, so a relist (after a watch
// expired or the API server came back) yields a deletion for every key the
// new list lacks, and its process is the controller's ProcessFunc: the
// reflector's events reach the sink through it, one at a time, in order.
type keyStore[T kubeObject] struct {
	kind string
	log  *slog.Logger
	// matches repeats the list's server-side filter, so an object that
	// stops matching on update is delivered as deleted whatever the server
	// sends.
	matches func(T) bool
	deliver func(namespace, name string, obj T) // nil obj: deleted

	mu sync.Mutex
	// versions maps a delivered object's key (namespace/name, or name for
	// cluster-scoped kinds) to its resourceVersion.
	versions map[string]string
}

func newKeyStore[T kubeObject](kind string, log *slog.Logger, matches func(T) bool, deliver func(namespace, name string, obj T)) *keyStore[T] {
	return &keyStore[T]{kind: kind, log: log, matches: matches, deliver: deliver, versions: make(map[string]string)}
}

var _ cache.KeyListerGetter = (*keyStore[*v1.Service])(nil)

// ListKeys returns the delivered objects' keys (the FIFO's relist diff).
func (s *keyStore[T]) ListKeys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.versions))
	for k := range s.versions {
		keys = append(keys, k)
	}
	return keys
}

// GetByKey reports whether key was delivered. There is no object to
// return: the FIFO then makes a tombstone holding the key alone, which is
// all process needs.
func (s *keyStore[T]) GetByKey(key string) (any, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.versions[key]
	return nil, ok, nil
}

// process handles one FIFO item (cache.Deltas).
func (s *keyStore[T]) process(obj any, _ bool) error {
	deltas, ok := obj.(cache.Deltas)
	if !ok {
		s.log.Error("the kube source's queue delivered an unexpected type", "kind", s.kind, "type", fmt.Sprintf("%T", obj))
		return nil
	}
	for _, d := range deltas {
		if d.Type == cache.Deleted {
			s.remove(d.Object)
		} else {
			s.upsert(d.Object)
		}
	}
	return nil
}

// upsert delivers obj unless its version was already delivered (a relist
// lists every object again), or as a deletion when it stopped matching.
func (s *keyStore[T]) upsert(obj any) {
	if _, ok := obj.(*metav1.PartialObjectMetadata); ok {
		return // a streamed object's stand-in: delivered as it arrived (deliverStreamed)
	}
	o, ok := obj.(T)
	if !ok {
		s.log.Error("the kube source received an unexpected type", "kind", s.kind, "type", fmt.Sprintf("%T", obj))
		return
	}
	key := storeKey(o.GetNamespace(), o.GetName())
	rv := o.GetResourceVersion()
	s.mu.Lock()
	old, known := s.versions[key]
	var deleted bool
	switch {
	case s.matches(o):
		if known && rv != "" && rv == old {
			s.mu.Unlock()
			return
		}
		s.versions[key] = rv
	case known:
		delete(s.versions, key)
		deleted = true
	default:
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	if deleted {
		var none T
		s.deliver(o.GetNamespace(), o.GetName(), none)
		return
	}
	s.deliver(o.GetNamespace(), o.GetName(), o)
}

// remove delivers the deletion of a delivered object. A deletion the
// watch missed arrives from the relist diff as a tombstone with the key
// alone.
func (s *keyStore[T]) remove(obj any) {
	var key string
	switch o := obj.(type) {
	case cache.DeletedFinalStateUnknown:
		key = o.Key
	case T:
		key = storeKey(o.GetNamespace(), o.GetName())
	default:
		s.log.Error("the kube source received an unexpected type", "kind", s.kind, "type", fmt.Sprintf("%T", obj))
		return
	}
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		s.log.Error("deletion with an invalid key", "kind", s.kind, "key", key, "error", err.Error())
		return
	}
	s.mu.Lock()
	_, known := s.versions[key]
	delete(s.versions, key)
	s.mu.Unlock()
	if known {
		var none T
		s.deliver(ns, name, none)
	}
}

// storeKey is cache.MetaNamespaceKeyFunc's key, the FIFO's.
func storeKey(namespace, name string) string {
	if namespace == "" {
		return name
	}
	return namespace + "/" + name
}

// deliverStreamed is the reflector's transform for a streamed initial list
// (watch-list) before the first one ended: it delivers obj at once and
// returns a stand-in holding its key and version alone. The reflector
// holds a streamed list whole until its end, then hands it to the queue
// (the relist diff); with stand-ins, that is a few MB at 10,000 Services
// where the objects, compacted, took about 40. The sink gets the objects
// in the order they stream, as it would from the queue: nothing else is
// queued before the first list ends. An object streamed by an attempt that
// failed part way is a real version; the retry streams it again (skipped
// when unchanged), and a deletion meanwhile is found by the relist diff.
func (s *keyStore[T]) deliverStreamed(obj any) (any, error) {
	o, ok := obj.(T)
	if !ok {
		return obj, nil
	}
	s.upsert(o)
	return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{
		Name: o.GetName(), Namespace: o.GetNamespace(), ResourceVersion: o.GetResourceVersion()}}, nil
}
