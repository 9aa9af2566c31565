package server

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// MetricsSource is implemented by a Backend with metrics of its own (the
// iptables mode's, with upstream's names), registered next to kp's.
type MetricsSource interface {
	Collectors() []prometheus.Collector
}

// RunOptions are what Run needs besides the Config.
type RunOptions struct {
	Backend proxy.Backend
	Sources []proxy.Source
	Log     *slog.Logger // nil discards
	// Observers are told about every successful sync, in order.
	Observers []proxy.SyncObserver
	// Collectors are registered with the metrics server's registry (an
	// observer's own metrics, for instance).
	Collectors []prometheus.Collector
	// Sysctls are the node settings made at start, for the status API.
	Sysctls []statusapi.Sysctl
	// ModeChoice is how the mode was chosen, for the status API.
	ModeChoice *statusapi.ModeChoice
	// Build is the kp binary that runs, for the status API and the
	// kp_build_info metric; an empty GoVersion or Platform is the running
	// one's.
	Build statusapi.Build
	// Inventory lists what programs the node's Services in the kernel,
	// served at /kp/v1/inventory; nil serves an empty list.
	Inventory InventoryFunc
	// SnapshotFacts completes /kp/v1/snapshot (the node's addresses, the
	// conntrack entries); nil leaves them out.
	SnapshotFacts SnapshotFacts
	// ShutdownGrace bounds how long a Backend that carries connections
	// itself (proxy.Shutdowner: userspace, or the switcher while it runs
	// userspace) lets them finish when Run returns; 0 is
	// DefaultShutdownGrace.
	ShutdownGrace time.Duration

	// releaseMemory runs after every successful full sync (nil: return the
	// freed heap to the kernel in the background); lowerGC sets GOGC (nil:
	// gctune.Lower). Tests log the calls.
	releaseMemory func()
	lowerGC       func(percent int) (restore func())
}
