package statusapi

import "time"

// SnapshotPath is GET /kp/v1/snapshot: everything kp explain needs to
// answer for this node, on this machine or any other (kp snapshot -o FILE):
// the model kp last synced, the facts of the node its decisions hang on,
// the mode, its rules as listed, and the conntrack entries of Service
// addresses.
const SnapshotPath = "/kp/" + Version + "/snapshot"

// SnapshotFormat names the snapshot format in every snapshot. A reader
// refuses another format; within this one, fields are only added.
const SnapshotFormat = "kp-snapshot/v1"

// Snapshot is GET /kp/v1/snapshot and the file kp snapshot writes.
type Snapshot struct {
	Format string `json:"format"` // SnapshotFormat
	// Build is the kp that took the snapshot.
	Build *Build    `json:"build,omitempty"`
	Time  time.Time `json:"time"`
	Mode  string    `json:"mode"` // nftables, iptables, ipvs, userspace, none
	// IPTablesBackend is the iptables mode's flavor, nft or legacy.
	IPTablesBackend string `json:"iptablesBackend,omitempty"`
	// Services is the model: every service port with its endpoints as
	// last synced, the Node and the Service CIDRs (/kp/v1/services). Its
	// Generation is 0 before the first sync.
	Services Services `json:"services"`
	// Proxy holds the settings and node facts kp's decisions hang on.
	Proxy ProxyFacts `json:"proxy"`
	// Rules are the mode's rules as an operator would list them; absent
	// when the mode cannot list them (RulesError says why).
	Rules      []RuleListing `json:"rules,omitempty"`
	RulesError string        `json:"rulesError,omitempty"`
	// Conntrack is the kernel's conntrack entries addressed to a Service
	// (by original destination); ConntrackError says why they are
	// missing or incomplete.
	Conntrack      []ConntrackEntry `json:"conntrack,omitempty"`
	ConntrackError string           `json:"conntrackError,omitempty"`
	// Affinity are the mode's ClientIP session affinity entries (which
	// client is pinned to which endpoint, how long still); AffinityError
	// says why they are missing or incomplete. Affinity is null when they
	// were not read (a snapshot of an older kp), [] when read and none.
	Affinity      []AffinityEntry `json:"affinity"`
	AffinityError string          `json:"affinityError,omitempty"`
}

// ProxyFacts are the settings and node facts behind kp's masquerade and
// NodePort decisions.
type ProxyFacts struct {
	// DetectLocalMode is detectLocalMode: ClusterCIDR, NodeCIDR,
	// BridgeInterface or InterfaceNamePrefix.
	DetectLocalMode string `json:"detectLocalMode"`
	// LocalCIDRs are the source ranges of traffic from pods (the cluster
	// CIDRs, or the node's pod CIDRs), at most one per family; empty in
	// the interface modes.
	LocalCIDRs []string `json:"localCIDRs,omitempty"`
	// LocalInterface is the interface (or, with LocalInterfacePrefix,
	// the prefix of the interfaces) pod traffic arrives on in the
	// interface modes.
	LocalInterface       string `json:"localInterface,omitempty"`
	LocalInterfacePrefix bool   `json:"localInterfacePrefix,omitempty"`
	MasqueradeAll        bool   `json:"masqueradeAll,omitempty"`
	// NodePortAddresses are --nodeport-addresses' CIDRs;
	// NodePortPrimary is its "primary" (the nftables mode's default).
	NodePortAddresses []string `json:"nodePortAddresses,omitempty"`
	NodePortPrimary   bool     `json:"nodePortPrimary,omitempty"`
	// NodePortIPs are the node's addresses NodePorts answer on now.
	NodePortIPs []string `json:"nodePortIPs,omitempty"`
	// LocalAddresses are the addresses of kp's network namespace (the
	// node's): traffic from them is the node's own.
	LocalAddresses []string `json:"localAddresses,omitempty"`
	// Error says which of these facts could not be read.
	Error string `json:"error,omitempty"`
}

// RuleListing is one place a mode keeps its rules, listed as its own
// tool lists it.
type RuleListing struct {
	Where  string `json:"where"`  // "nftables ip kp", "iptables-nft IPv4 nat"
	Format string `json:"format"` // nft, iptables-save, ipvsadm
	Text   string `json:"text"`
}

// ConntrackEntry is one conntrack entry, as conntrack -L shows it.
type ConntrackEntry struct {
	Protocol string `json:"protocol"` // tcp, udp, sctp
	// OrigSrc and OrigDst are the client's side (OrigDst the Service
	// address); ReplySrc is where the kernel sends the flow (after DNAT,
	// the endpoint), ReplyDst where answers go (after masquerade, the
	// node).
	OrigSrc        string `json:"origSrc"`
	OrigDst        string `json:"origDst"`
	ReplySrc       string `json:"replySrc"`
	ReplyDst       string `json:"replyDst"`
	State          string `json:"state"`
	TimeoutSeconds int64  `json:"timeoutSeconds"`
}
