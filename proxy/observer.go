package proxy

import (
	"context"
	"log/slog"
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kpproxy/kp/proxy/statusapi"
)

// RunOptions are what Run needs besides the Config.
type RunOptions struct {
	Backend Backend
	Sources []Source
	Log     *slog.Logger // nil discards
	// Observers are told about every successful sync, in order.
	Observers []SyncObserver
	// Collectors are registered with the metrics server's registry (an
	// observer's own metrics, for instance).
	Collectors []prometheus.Collector
	// Sysctls are the node settings made at start, for the status API.
	Sysctls []statusapi.Sysctl
	// ModeChoice is how the mode was chosen, for the status API.
	ModeChoice *statusapi.ModeChoice
	// Inventory lists what programs the node's Services in the kernel,
	// served at /kp/v1/inventory; nil serves an empty list.
	Inventory InventoryFunc

	// releaseMemory runs after every successful full sync (nil: return the
	// freed heap to the kernel in the background); lowerGC sets GOGC (nil:
	// LowerGC). Tests log the calls.
	releaseMemory func()
	lowerGC       func(percent int) (restore func())
}

// SyncObserver is told about every successful sync, after the backend
// applied it. Work that follows the kernel's forwarding state without being
// a backend (conntrack cleanup) hooks in here, so the core knows nothing of
// it.
type SyncObserver interface {
	// Synced runs in the sync loop, after a successful sync of cur: the
	// next sync waits for it. prev is the State of the previous successful
	// sync (nil for the first one). Neither may be modified. Failures are
	// the observer's to log and count; the sync itself already succeeded.
	Synced(ctx context.Context, prev, cur *State)
}

// CounterReporter is implemented by a Backend that counts the new
// connections it sends to each endpoint (the nftables mode's named
// counters). The status API reports them per endpoint.
type CounterReporter interface {
	// EndpointCounters returns the counters of the endpoints of s that the
	// backend programmed; an endpoint it does not count is absent.
	EndpointCounters(s *State) (map[EndpointRef]EndpointCounter, error)
}

// EndpointRef names one endpoint of one service port.
type EndpointRef struct {
	ServicePort ServicePortName
	Endpoint    netip.AddrPort
}

// EndpointCounter counts new connections to an endpoint: the first packet
// of each, and those packets' bytes. A backend that proxies connections
// itself (userspace) counts every connection, every byte it copied (both
// ways, when the connection ends), and the connections open now (Active;
// nil for the backends that cannot know).
type EndpointCounter struct {
	Packets, Bytes uint64
	Active         *int64
}
