// Package statusapi holds the JSON types of kp proxy's status API and a
// small client for it. kp serves the API on a local Unix socket that only
// root on the node can open (DefaultSocket), under a versioned path
// (/kp/v1/...), never on the network; kp top, kp flows, kp status and kp
// migrate are its clients. The types and the client use the standard library alone;
// StateFromServices (state.go) imports the core (proxy) to rebuild a State
// from a report.
//
// Compatibility: within v1, fields are only ever added. A client ignores
// fields it does not know; a field kp cannot fill is omitted, not zeroed.
package statusapi

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Version is the API version these types describe; it is in every path.
const Version = "v1"

// DefaultSocket is where kp proxy serves the status API (--status-socket):
// a Unix socket of mode 0600 in a directory of mode 0700, both root's.
const DefaultSocket = "/run/kp/kp.sock"

// Paths of the API, relative to the server's root.
const (
	StatusPath   = "/kp/" + Version + "/status"
	ServicesPath = "/kp/" + Version + "/services"
)

// Status is GET /kp/v1/status: the proxy and its sync loop.
type Status struct {
	APIVersion string    `json:"apiVersion"` // "kp/v1"
	Mode       string    `json:"mode"`       // nftables, iptables, ipvs, userspace
	Node       string    `json:"node"`       // the node name kp runs as
	StartTime  time.Time `json:"startTime"`
	// Now is the server's clock when it answered, so a client can compute
	// ages without trusting its own clock.
	Now time.Time `json:"now"`
	// Healthy is what /healthz's sync part says: synced recently enough.
	Healthy bool `json:"healthy"`

	// LastSync is the last successful sync; absent before the first one.
	LastSync *Sync `json:"lastSync,omitempty"`
	// Syncs counts sync attempts since start.
	Syncs SyncCounts `json:"syncs"`
	// LastError is the last failed sync; absent when none failed.
	LastError *SyncError `json:"lastError,omitempty"`

	// ServicePorts and Endpoints count what the last successful sync
	// programmed.
	ServicePorts int `json:"servicePorts"`
	Endpoints    int `json:"endpoints"`

	// Sysctls are the node settings kp was configured to make at start
	// (conntrack's, as upstream's --conntrack-* flags) and the values in
	// force after it tried.
	Sysctls []Sysctl `json:"sysctls,omitempty"`

	// ModeChoice says how Mode was chosen.
	ModeChoice *ModeChoice `json:"modeChoice,omitempty"`

	// IPTablesBackend is the iptables mode's flavor, nft or legacy.
	IPTablesBackend string `json:"iptablesBackend,omitempty"`
	// Migration is the last mode switch asked for, absent when none.
	Migration *Migration `json:"migration,omitempty"`

	// Build is the kp binary that answers; absent from a kp that
	// predates the field.
	Build *Build `json:"build,omitempty"`
}

// Build identifies a kp binary: what `kp version -o json` prints, the
// status report's build and the labels of the kp_build_info metric.
// Version, Commit and BuildDate are stamped at build time (make build,
// make release: -ldflags -X); BuildDate is the commit's date, not the
// build's, so that two builds of one commit are the same file.
type Build struct {
	Version   string `json:"version"`   // v0.1.0, or git describe's output
	Commit    string `json:"commit"`    // the full commit hash
	BuildDate string `json:"buildDate"` // RFC 3339, UTC
	GoVersion string `json:"goVersion"` // go1.26.0
	Platform  string `json:"platform"`  // linux/amd64
}

// ModeChoice is how kp chose its mode: forced (a flag, the config file),
// or auto, the first mode of nftables, iptables, ipvs, userspace whose
// probe passed, after the ones refused.
type ModeChoice struct {
	// From is "auto", "--proxy-mode=iptables" or "mode iptables in --config FILE".
	From    string        `json:"from"`
	Auto    bool          `json:"auto"`
	Refused []RefusedMode `json:"refused,omitempty"`
}

// RefusedMode is a mode auto tried before the one it chose.
type RefusedMode struct {
	Mode   string `json:"mode"`
	Reason string `json:"reason"`
}

// Sysctl is one node setting kp was asked to make.
type Sysctl struct {
	Name  string `json:"name"`  // net.netfilter.nf_conntrack_tcp_timeout_close_wait
	Want  string `json:"want"`  // the configured value
	Value string `json:"value"` // the value in force
	// Error says why kp could not set it (a read-only /proc/sys, say).
	Error string `json:"error,omitempty"`
}

// Sync describes one successful sync.
type Sync struct {
	Time            time.Time `json:"time"` // when it ended
	DurationSeconds float64   `json:"durationSeconds"`
	// Full says the backend re-rendered everything rather than the changes.
	Full bool `json:"full"`
	// Generation is the State snapshot's generation (see /kp/v1/services).
	Generation uint64 `json:"generation"`
}

// SyncCounts counts syncs by outcome.
type SyncCounts struct {
	Succeeded uint64 `json:"succeeded"`
	Failed    uint64 `json:"failed"`
	Full      uint64 `json:"full"`
	Partial   uint64 `json:"partial"`
}

// SyncError is a failed sync.
type SyncError struct {
	Time    time.Time `json:"time"`
	Message string    `json:"message"`
}

// Services is GET /kp/v1/services: every service port as last synced into
// the kernel. The query parameters namespace and service (a Service name)
// restrict the list.
type Services struct {
	APIVersion string `json:"apiVersion"` // "kp/v1"
	// Generation of the snapshot listed; 0 before the first sync.
	Generation uint64    `json:"generation"`
	SyncTime   time.Time `json:"syncTime,omitempty"`
	Node       Node      `json:"node"`
	// CountersError says why per-endpoint counters are missing, when the
	// backend has them but could not read them.
	CountersError string        `json:"countersError,omitempty"`
	ServicePorts  []ServicePort `json:"servicePorts"`
	// ServiceCIDRs are the ranges ClusterIPs are allocated from (an
	// unallocated address in them is dropped); absent when unknown.
	ServiceCIDRs []string `json:"serviceCIDRs,omitempty"`
}

// Node is what kp knows about its node.
type Node struct {
	Name string   `json:"name"`
	IPs  []string `json:"ips,omitempty"`
	Zone string   `json:"zone,omitempty"`
}

// ServicePort is one port of one Service, with its addresses and endpoints.
// Names follow the Service API.
type ServicePort struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`     // the Service's name
	PortName  string `json:"portName"` // spec.ports[].name; "" for a single unnamed port
	Protocol  string `json:"protocol"` // TCP, UDP, SCTP
	Type      string `json:"type"`     // ClusterIP, NodePort, LoadBalancer

	ClusterIPs      []string `json:"clusterIPs"`
	Port            int32    `json:"port"`
	NodePort        int32    `json:"nodePort,omitempty"`
	ExternalIPs     []string `json:"externalIPs,omitempty"`
	LoadBalancerIPs []string `json:"loadBalancerIPs,omitempty"`

	ExternalTrafficPolicy string `json:"externalTrafficPolicy"` // Cluster or Local
	InternalTrafficPolicy string `json:"internalTrafficPolicy"` // Cluster or Local
	// SessionAffinitySeconds is the ClientIP affinity timeout; 0 for None.
	SessionAffinitySeconds int64 `json:"sessionAffinitySeconds,omitempty"`
	// LoadBalancerSourceRanges, HealthCheckNodePort and
	// TrafficDistribution are the Service's fields of those names.
	LoadBalancerSourceRanges []string `json:"loadBalancerSourceRanges,omitempty"`
	HealthCheckNodePort      int32    `json:"healthCheckNodePort,omitempty"`
	TrafficDistribution      string   `json:"trafficDistribution,omitempty"`

	Endpoints []Endpoint `json:"endpoints"`
}

// Endpoint is one backend of a ServicePort.
type Endpoint struct {
	IP          string `json:"ip"`
	Port        int32  `json:"port"`
	Ready       bool   `json:"ready"`
	Serving     bool   `json:"serving"`
	Terminating bool   `json:"terminating"`
	NodeName    string `json:"nodeName,omitempty"`
	Zone        string `json:"zone,omitempty"`
	// Hints are the EndpointSlice's hints.forZones and hints.forNodes.
	Hints *EndpointHints `json:"hints,omitempty"`
	// Usable says the endpoint may receive new connections (kp's endpoint
	// selection picked it).
	Usable bool `json:"usable"`
	// Counters are the new connections the backend sent to this endpoint
	// since kp first programmed it; absent when the backend does not count.
	Counters *Counters `json:"counters,omitempty"`
}

// EndpointHints are where the EndpointSlice controller wants an endpoint
// used (topology-aware routing, trafficDistribution).
type EndpointHints struct {
	ForZones []string `json:"forZones,omitempty"`
	ForNodes []string `json:"forNodes,omitempty"`
}

// Counters count the new connections sent to an endpoint: one packet per
// connection, and the bytes of those first packets.
type Counters struct {
	NewConnections uint64 `json:"newConnections"`
	Bytes          uint64 `json:"bytes"`
	// ActiveConnections are the connections open now, in the modes that
	// proxy them (userspace; there Bytes are every byte copied both ways,
	// counted when a connection ends).
	ActiveConnections *int64 `json:"activeConnections,omitempty"`
}

// MigrationPath is GET (progress) and POST (a request) for switching the
// running proxy to another mode; POST is accepted from loopback only.
const MigrationPath = "/kp/" + Version + "/migration"

// MigrationRequest is the body of POST /kp/v1/migration.
type MigrationRequest struct {
	// To is the target mode: nftables, iptables, iptables-nft,
	// iptables-legacy, ipvs or userspace. Asking for the mode that runs
	// re-verifies it and removes every other proxy's leftovers.
	To string `json:"to"`
	// RequestedBy says who asked, for the logs and the Node's Event ("kp
	// migrate node"): at most MaxRequestedBy bytes of printable UTF-8, no
	// newline (ValidRequestedBy).
	RequestedBy string `json:"requestedBy,omitempty"`
}

// Requests: every write to the status API is JSON (ContentType; anything
// else is refused with 415, so a browser's form or text/plain POST, which
// needs no CORS preflight, cannot reach it) of at most MaxRequestBytes
// (413 beyond).
const (
	ContentType     = "application/json"
	MaxRequestBytes = 64 << 10
	// MaxRequestedBy bounds MigrationRequest.RequestedBy, in bytes.
	MaxRequestedBy = 128
)

// ValidRequestedBy checks a MigrationRequest's RequestedBy before it
// reaches a log line or an Event on the Node: at most MaxRequestedBy bytes
// of valid UTF-8, every character printable (no newline, tab, escape or
// other control character that could forge or garble a line).
func ValidRequestedBy(s string) error {
	if len(s) > MaxRequestedBy {
		return fmt.Errorf("requestedBy is %d bytes long, at most %d are accepted", len(s), MaxRequestedBy)
	}
	if !utf8.ValidString(s) {
		return errors.New("requestedBy is not valid UTF-8")
	}
	for i, r := range s {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("requestedBy holds the unprintable character %U at byte %d", r, i)
		}
	}
	return nil
}

// Migration phases.
const (
	MigrationPending   = "pending"
	MigrationRunning   = "running"
	MigrationSucceeded = "succeeded"
	MigrationFailed    = "failed"
)

// Migration is the progress of the last mode switch the proxy was asked
// for (GET /kp/v1/migration, and /kp/v1/status's migration).
type Migration struct {
	// ID increases with every request; a client waits for its own.
	ID          uint64 `json:"id"`
	From        string `json:"from"` // the mode that ran when it started, e.g. iptables-nft
	To          string `json:"to"`
	RequestedBy string `json:"requestedBy,omitempty"`
	Phase       string `json:"phase"` // pending, running, succeeded, failed
	// Steps are program, verify and remove, in order, as far as reached.
	Steps   []MigrationStep `json:"steps,omitempty"`
	Error   string          `json:"error,omitempty"`
	Started time.Time       `json:"started,omitempty"`
	Ended   time.Time       `json:"ended,omitempty"`
	// Verification is what the verify step found.
	Verification *Verification `json:"verification,omitempty"`
	// KeptForConnections counts the IPVS virtual servers (of kp's ipvs
	// mode or kube-proxy's) the remove step kept because established
	// connections still use them; kp removes them once those end.
	KeptForConnections int `json:"keptForConnections,omitempty"`
}

// MigrationStep is one step of a migration.
type MigrationStep struct {
	Name    string    `json:"name"` // program, verify, remove
	Detail  string    `json:"detail,omitempty"`
	Error   string    `json:"error,omitempty"`
	Started time.Time `json:"started"`
	Ended   time.Time `json:"ended,omitempty"`
}

// Verification is the proof that the new mode carries every Service: a
// connection (TCP) or a datagram (UDP) from inside the node to each
// ClusterIP of each service port with endpoints, and the new mode's own
// per-endpoint counters of that service port having moved.
type Verification struct {
	ServicePorts int `json:"servicePorts"` // proven
	Probes       int `json:"probes"`       // connections and datagrams sent
	// Addresses counts the probes by kind of address: ClusterIP,
	// NodePort (one per NodePort address of the node), externalIP,
	// LoadBalancer IP.
	Addresses map[string]int `json:"addresses,omitempty"`
	// Skipped are the service ports and kinds of address not probed, with
	// why (no endpoints usable from the node, SCTP, LoadBalancer source
	// ranges).
	Skipped []string `json:"skipped,omitempty"`
	// Failed are the addresses whose service port's counters did not
	// move: the new mode did not carry them.
	Failed []string `json:"failed,omitempty"`
	// Warnings are addresses carried by the new mode (their counters
	// moved) whose endpoint did not accept the probe.
	Warnings []string `json:"warnings,omitempty"`
}

// Summary says how many probes went to each kind of address, and how many
// were skipped: "3 probes: 1 ClusterIP, 2 NodePort; 0 skipped".
func (v *Verification) Summary() string {
	var kinds []string
	for _, k := range []string{"ClusterIP", "NodePort", "externalIP", "LoadBalancer IP"} {
		if n := v.Addresses[k]; n > 0 {
			kinds = append(kinds, fmt.Sprintf("%d %s", n, k))
		}
	}
	s := fmt.Sprintf("%d probes", v.Probes)
	if len(kinds) > 0 {
		s += ": " + strings.Join(kinds, ", ")
	}
	return fmt.Sprintf("%s; %d skipped", s, len(v.Skipped))
}

// InventoryPath is GET /kp/v1/inventory: what programs this node's
// Services in the kernel now, kp's rules and any other proxy's (upstream
// kube-proxy's), read when asked. kp migrate cluster reads it to gate a
// node's step on what is in the kernel: kube-proxy's leftovers gone after
// a take-over, the returning kube-proxy's rules in place before kp removes
// its own.
const InventoryPath = "/kp/" + Version + "/inventory"

// Inventory is GET /kp/v1/inventory.
type Inventory struct {
	APIVersion string    `json:"apiVersion"` // "kp/v1"
	Node       string    `json:"node"`
	Time       time.Time `json:"time"`
	Programs   []Program `json:"programs"`
	// Error says what could not be read (a missing iptables flavor is not
	// an error: it has nothing to list).
	Error string `json:"error,omitempty"`
}

// Program is one place where a proxy programs the node's Services: an
// nftables table, or one iptables flavor and family, with its size.
type Program struct {
	Owner string `json:"owner"` // kp, kube-proxy
	// Mode is the owner's mode: for kp nftables, iptables-nft,
	// iptables-legacy, userspace; for kube-proxy nftables, iptables/ipvs
	// (its iptables chains serve both its modes) or ipvs.
	Mode           string `json:"mode"`
	Where          string `json:"where"` // "nftables ip kp", "iptables-nft IPv4"
	Chains         int    `json:"chains"`
	Rules          int    `json:"rules"`
	Elements       int    `json:"elements,omitempty"`
	VirtualServers int    `json:"virtualServers,omitempty"`
}
