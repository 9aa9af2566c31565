package proxy

import (
	"context"
	"net/netip"
	"time"
)

// The optional capabilities of a Backend, each a small interface that a
// mode implements when it has it; callers ask for one by name.

// Shutdowner is implemented by a Backend that carries connections itself
// (userspace): Shutdown stops accepting and lets the open connections
// finish until ctx ends.
type Shutdowner interface {
	Shutdown(ctx context.Context) error
}

// Drainer is implemented by a Backend that carries connections itself
// (userspace) and must be told when a switch away removed its rules (kp
// removes them with a backend of its own, not this one): from then on it
// opens nothing new and hands its flows over to the mode that replaced it.
type Drainer interface {
	RulesRemoved()
}

// Triggerable is implemented by a Backend that asks for a sync of its own
// (the mode switcher, when a switch is requested): the sync loop hands it
// its trigger.
type Triggerable interface {
	SetTrigger(trigger func())
}

// DriftDetector is implemented by a Backend that notices when another
// process changes the rules it wrote (an nft or iptables command, a
// deleted IPVS virtual server): from the kernel's change events where the
// mode has them (nftables), else by comparing the kernel with what it
// wrote, every period (PollDrift). DetectDrift watches until ctx ends and
// calls drifted for each change; the sync loop then runs a sync at once,
// which repairs it (the backend makes that sync reconcile everything).
// The periodic resync is not needed for it. It returns an error when it
// cannot watch at all.
type DriftDetector interface {
	DetectDrift(ctx context.Context, drifted func(Drift)) error
}

// ActiveKeepingCleaner is implemented by a Backend whose rules carry
// established connections after another mode took over (ipvs: the virtual
// servers): CleanupKeepingActive removes the rest and reports how much it
// kept.
type ActiveKeepingCleaner interface {
	CleanupKeepingActive(ctx context.Context) (kept int, err error)
}

// TargetReporter is implemented by a Backend whose Target says more than
// its Mode (iptables: the flavor it detected or was given).
type TargetReporter interface {
	Target() Target
}

// TargetOf is the target a probed backend runs as.
func TargetOf(b Backend) Target {
	if r, ok := b.(TargetReporter); ok {
		return r.Target()
	}
	return Target{Mode: b.Mode()}
}

// NodePortScoper is implemented by a Backend built from settings that say
// where NodePorts answer (--nodeport-addresses: CIDRs, or with primary the
// Node's IPs, whose default differs by mode). The service health server
// listens for healthCheckNodePorts there too, so after a switch it follows
// the mode that runs, as it would in a kp started in that mode.
type NodePortScoper interface {
	NodePortScope() (cidrs []netip.Prefix, primary bool)
}

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

// SysctlNeeder is implemented by a Backend that needs kernel settings of
// its network namespace (ipvs: net.ipv4.vs.*, ip_forward, ARP; iptables:
// route_localnet for localhost NodePorts). The list is the one the backend
// sets at its setup, the one kp sysctl (the DaemonSet's privileged init
// container) sets before kp proxy starts, and the one kp proxy checks at
// start: a container without privileges has a read-only /proc/sys.
type SysctlNeeder interface {
	Sysctls() []Sysctl
}

// Sysctl is one kernel setting a backend needs.
type Sysctl struct {
	Name  string // dotted: net.ipv4.vs.conntrack
	Value string
	Why   string // what goes wrong without it, for the log
}

// RuleLister is implemented by a Backend that can list its rules as the
// mode's own tool lists them (nft list table, iptables-save), for kp
// snapshot: an operator reads them, and kp explain shows them beside its
// answer.
type RuleLister interface {
	ListRules(ctx context.Context) ([]RuleListing, error)
}

// RuleListing is one place a mode keeps its rules, as listed.
type RuleListing struct {
	Where  string // "nftables ip kp", "iptables-nft IPv4 nat"
	Format string // nft, iptables-save
	Text   string
}

// AffinityLister is implemented by a Backend that can list its ClientIP
// session affinity entries (nftables: the endpoints' dynamic sets;
// iptables: the recent module's lists; ipvs: the persistence templates;
// userspace: its balancers' memory), for kp snapshot and kp explain: which
// endpoint a client is pinned to, and for how long. Only s's service
// ports are listed: s is the State the backend last synced, by whose names
// the entries are told apart.
type AffinityLister interface {
	ListAffinity(ctx context.Context, s *State) ([]AffinityEntry, error)
}

// AffinityEntry.Traffic values.
const (
	AffinityInternal = "internal"
	AffinityExternal = "external"
)

// AffinityEntry is one client pinned to one endpoint of a service port.
type AffinityEntry struct {
	ServicePort ServicePortName
	Client      netip.Addr
	Endpoint    netip.AddrPort
	// Frontend is the Service address and port the entry holds for, in
	// the modes that keep one per address (ipvs: a template per virtual
	// server); zero where one entry holds for all of the port's addresses.
	Frontend netip.AddrPort
	// Traffic is the port's traffic the entry holds for, in the modes that
	// remember clients apart by it (userspace: a listener each):
	// AffinityInternal (ClusterIPs) or AffinityExternal (NodePort,
	// external and LoadBalancer addresses); "" for all of it.
	Traffic string
	// Expires is what is left of the entry's life: the client's next new
	// connection within it goes to Endpoint (and renews it).
	Expires time.Duration
}
