package proxy

import (
	"cmp"
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// ChangeTrackerOptions configures a ChangeTracker.
type ChangeTrackerOptions struct {
	// NodeName is the node the proxy runs on; OnNode ignores other Nodes.
	NodeName string
	Log      *slog.Logger
	// OnChange is called, with no lock held, after every change that can
	// alter the next snapshot (the sync runner's Trigger). No-op updates do
	// not call it.
	OnChange func()
	// Sources is how many sources must call OnSynced before Synced is true.
	Sources int
	// Clock is the real clock when nil. Trigger times older than the
	// tracker are ignored, as upstream does: a proxy that starts does not
	// measure how long ago objects were created.
	Clock clock.PassiveClock
	// ServiceCIDRs are Service CIDRs known without ServiceCIDR objects
	// (kp's --service-cidrs); State.ServiceCIDRs is their union with the
	// objects'.
	ServiceCIDRs []netip.Prefix
	// IgnoreExternalIPs drops every Service's externalIPs (upstream's
	// feature gate AllowServiceExternalIPs=false).
	IgnoreExternalIPs bool
}

// ChangeTracker is the Sink every source feeds. It converts and validates
// each object once, when it arrives, keeps the current version of every
// Service and EndpointSlice, and remembers which Services were touched, so
// that Snapshot re-merges only those: the cost of a sync follows the number
// of changes, not the number of Services.
type ChangeTracker struct {
	nodeName string
	log      *slog.Logger
	onChange func()
	sources  int
	started  time.Time

	// batchMu is held by Batch for its calls, and taken by Snapshot
	// before mu, so a snapshot holds all of a batch or none of it.
	batchMu sync.Mutex

	mu       sync.Mutex
	services map[types.NamespacedName]*serviceEntry
	slices   map[types.NamespacedName]*sliceEntry // by the slice's own namespace/name
	// bySvc indexes valid slices by the Service they name, sorted by slice
	// name (a Service has one or a few: a map each took 400 bytes).
	bySvc map[types.NamespacedName][]*sliceInfo
	// dirty holds the Services touched since the last Snapshot.
	dirty map[types.NamespacedName]struct{}
	// triggerTimes holds, per dirty Service, the oldest trigger time of the
	// slice changes not yet in a snapshot.
	triggerTimes map[types.NamespacedName]time.Time
	node         Node
	nodeLogKey   string

	ignoreExternalIPs bool

	syncedCount int
	synced      chan struct{} // closed once every source has synced

	// prev is the last snapshot. published holds, for each Service changed
	// since, the ServicePortNames it contributed to prev (recorded at its
	// first change), so its removed ports can be found without scanning
	// every ServicePort and without keeping every Service's names.
	prev      *State
	published map[types.NamespacedName][]ServicePortName

	changeCounter
	serviceCIDRs     serviceCIDRState
	prevServiceCIDRs []netip.Prefix
}

type serviceEntry struct {
	resourceVersion string
	ports           []*ServicePort // nil for ignored or unusable Services
	logKey          string
}

type sliceEntry struct {
	resourceVersion string
	info            *sliceInfo // nil for ignored or unusable slices
	logKey          string
}

var (
	_ Sink    = (*ChangeTracker)(nil)
	_ Batcher = (*ChangeTracker)(nil)
)

// Batch runs fn, whose calls (OnService, OnEndpointSlice, ...) Snapshot
// sees all or none of. fn must not call Snapshot.
func (t *ChangeTracker) Batch(fn func()) {
	t.batchMu.Lock()
	defer t.batchMu.Unlock()
	fn()
}

// NewChangeTracker returns an empty tracker; its first Snapshot has
// Generation 1.
func NewChangeTracker(opts ChangeTrackerOptions) *ChangeTracker {
	t := &ChangeTracker{
		nodeName:     opts.NodeName,
		log:          opts.Log,
		onChange:     opts.OnChange,
		sources:      opts.Sources,
		services:     make(map[types.NamespacedName]*serviceEntry),
		slices:       make(map[types.NamespacedName]*sliceEntry),
		bySvc:        make(map[types.NamespacedName][]*sliceInfo),
		dirty:        make(map[types.NamespacedName]struct{}),
		triggerTimes: make(map[types.NamespacedName]time.Time),
		node:         Node{Name: opts.NodeName},
		synced:       make(chan struct{}),
		prev:         &State{},
		published:    make(map[types.NamespacedName][]ServicePortName),
	}
	t.serviceCIDRs.static = slices.Clone(opts.ServiceCIDRs)
	t.ignoreExternalIPs = opts.IgnoreExternalIPs
	clk := opts.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	t.started = clk.Now()
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	if t.onChange == nil {
		t.onChange = func() {}
	}
	if t.sources <= 0 {
		close(t.synced)
	}
	return t
}

// OnService records a Service's new version (nil: deleted).
func (t *ChangeTracker) OnService(namespace, name string, svc *v1.Service) {
	key := types.NamespacedName{Namespace: namespace, Name: name}
	t.mu.Lock()
	changed := t.updateService(key, svc)
	if changed {
		t.serviceChanged(key)
	}
	t.mu.Unlock()
	if changed {
		t.onChange()
	}
}

func (t *ChangeTracker) updateService(key types.NamespacedName, svc *v1.Service) bool {
	old := t.services[key]
	if svc == nil {
		if old == nil {
			return false
		}
		if len(old.ports) > 0 {
			t.notePublished(key, old)
		}
		delete(t.services, key)
		return t.markDirty(key, len(old.ports) > 0)
	}
	// Informer resyncs re-deliver unchanged objects; skip them outright.
	if old != nil && svc.ResourceVersion != "" && svc.ResourceVersion == old.resourceVersion {
		return false
	}
	ports, err := ServicePortsFromService(svc)
	if t.ignoreExternalIPs {
		for _, sp := range ports {
			sp.ExternalIPs = nil
		}
	}
	entry := &serviceEntry{resourceVersion: svc.ResourceVersion, ports: ports}
	entry.logKey = t.logOnce(old.lastLogKey(), svc.ResourceVersion, unjoin(err))
	t.services[key] = entry
	var oldPorts []*ServicePort
	if old != nil {
		oldPorts = old.ports
	}
	changed := !PortsEqual(oldPorts, ports)
	if changed {
		t.notePublished(key, old)
	}
	return t.markDirty(key, changed)
}

// notePublished records, at a Service's first change since the last
// snapshot, the names of the ports it had then (old, nil when it had none):
// what that snapshot holds of it. Until its next change a Service's entry
// is what was published.
func (t *ChangeTracker) notePublished(key types.NamespacedName, old *serviceEntry) {
	if _, ok := t.published[key]; ok {
		return
	}
	var names []ServicePortName
	if old != nil {
		for _, sp := range old.ports {
			names = append(names, sp.Name)
		}
	}
	t.published[key] = names
}

// OnEndpointSlice records an EndpointSlice's new version (nil: deleted).
func (t *ChangeTracker) OnEndpointSlice(namespace, name string, slice *discovery.EndpointSlice) {
	key := types.NamespacedName{Namespace: namespace, Name: name}
	t.mu.Lock()
	changed := t.updateSlice(key, slice)
	if changed {
		t.endpointsChanged(key)
	}
	t.mu.Unlock()
	if changed {
		t.onChange()
	}
}

func (t *ChangeTracker) updateSlice(key types.NamespacedName, slice *discovery.EndpointSlice) bool {
	old := t.slices[key]
	var oldInfo, info *sliceInfo
	if old != nil {
		oldInfo = old.info
	}
	if slice == nil {
		delete(t.slices, key)
	} else {
		if old != nil && slice.ResourceVersion != "" && slice.ResourceVersion == old.resourceVersion {
			return false
		}
		var errs []error
		info, errs = ParseEndpointSlice(slice)
		entry := &sliceEntry{resourceVersion: slice.ResourceVersion, info: info}
		entry.logKey = t.logOnce(old.lastLogKey(), slice.ResourceVersion, errs)
		t.slices[key] = entry
	}
	if oldInfo.Equal(info) {
		return false
	}
	if oldInfo != nil {
		infos := slices.DeleteFunc(t.bySvc[oldInfo.service], func(i *sliceInfo) bool { return i.name == oldInfo.name })
		if len(infos) == 0 {
			delete(t.bySvc, oldInfo.service)
		} else {
			t.bySvc[oldInfo.service] = infos
		}
		t.markDirty(oldInfo.service, true)
	}
	if info != nil {
		infos := t.bySvc[info.service]
		i, found := slices.BinarySearchFunc(infos, info.name, func(s *sliceInfo, name string) int { return cmp.Compare(s.name, name) })
		if found {
			infos[i] = info
		} else {
			infos = slices.Insert(infos, i, info)
		}
		t.bySvc[info.service] = infos
		t.markDirty(info.service, true)
		if info.TriggerTime.After(t.started) {
			if cur, ok := t.triggerTimes[info.service]; !ok || info.TriggerTime.Before(cur) {
				t.triggerTimes[info.service] = info.TriggerTime
			}
		}
	}
	return true
}

// OnNode records the proxy's own Node (nil: unknown or deleted).
func (t *ChangeTracker) OnNode(node *v1.Node) {
	if node != nil && t.nodeName != "" && node.Name != t.nodeName {
		t.log.Debug("ignoring another node", "node", node.Name, "want", t.nodeName)
		return
	}
	n, errs := NodeFrom(t.nodeName, node)
	t.mu.Lock()
	rv := ""
	if node != nil {
		rv = node.ResourceVersion
	}
	t.nodeLogKey = t.logOnce(t.nodeLogKey, rv, errs)
	changed := !n.Equal(t.node)
	t.node = n
	t.mu.Unlock()
	if changed {
		t.onChange()
	}
}

// OnSynced counts a source's initial sync; the last one triggers a sync.
func (t *ChangeTracker) OnSynced() {
	t.mu.Lock()
	t.syncedCount++
	done := t.syncedCount == t.sources
	if done {
		close(t.synced)
	}
	t.mu.Unlock()
	if done {
		t.onChange()
	}
}

// Synced reports whether every source delivered its initial view.
func (t *ChangeTracker) Synced() bool {
	select {
	case <-t.synced:
		return true
	default:
		return false
	}
}

// WaitForSync blocks until every source synced, or ctx is done.
func (t *ChangeTracker) WaitForSync(ctx context.Context) error {
	select {
	case <-t.synced:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// markDirty records key as touched when changed is true, and returns changed.
func (t *ChangeTracker) markDirty(key types.NamespacedName, changed bool) bool {
	if changed {
		t.dirty[key] = struct{}{}
	}
	return changed
}

// logOnce logs errs unless the same errors were already logged for this
// version of the object, and returns the key to remember. Objects without a
// resourceVersion (from manifests) are logged again only when their errors
// change.
func (t *ChangeTracker) logOnce(prevKey, resourceVersion string, errs []error) string {
	key := resourceVersion + "\x00" + ErrorsKey(errs)
	if len(errs) > 0 && key != prevKey {
		logFieldErrors(t.log, errs)
	}
	return key
}

func (e *serviceEntry) lastLogKey() string {
	if e == nil {
		return ""
	}
	return e.logKey
}

func (e *sliceEntry) lastLogKey() string {
	if e == nil {
		return ""
	}
	return e.logKey
}

func PortsEqual(a, b []*ServicePort) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].Equal(b[i]) {
			return false
		}
	}
	return true
}

// unjoin splits an error made by errors.Join back into its parts.
func unjoin(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
