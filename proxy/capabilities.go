package proxy

import (
	"context"
	"net/netip"
)

// FullSyncReporter is implemented by a Backend that can tell whether its
// last Sync re-rendered everything, for the full/partial sync duration
// metrics. Without it, the first sync and a sync after a failure count as
// full and the others as partial.
type FullSyncReporter interface {
	LastSyncFull() bool
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
