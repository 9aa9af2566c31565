package explain

// The answer, as plain values that print as text (Write) and JSON
// (kp explain -o json: these fields, only ever added to).

// Verdict is what happens to the packet.
type Verdict string

const (
	// VerdictNotKPs: no rule of kp's matches; routing and the node's
	// own sockets decide.
	VerdictNotKPs Verdict = "not-kps"
	VerdictDNAT   Verdict = "dnat"
	VerdictReject Verdict = "reject"
	VerdictDrop   Verdict = "drop"
)

// Address kinds: which of a Service's addresses the packet is for.
const (
	KindClusterIP      = "ClusterIP"
	KindNodePort       = "NodePort"
	KindExternalIP     = "externalIP"
	KindLoadBalancerIP = "LoadBalancer IP"
	// KindServiceCIDR is an address in a Service CIDR no Service has.
	KindServiceCIDR = "unallocated ClusterIP"
	KindNone        = "none"
)

// Explanation is kp explain's answer for one packet.
type Explanation struct {
	Packet string `json:"packet"` // "from 10.244.1.10 to 10.96.0.10:53/udp"
	Mode   string `json:"mode"`
	// Verdict and Why are the answer in one word and one sentence.
	Verdict Verdict `json:"verdict"`
	Why     string  `json:"why"`
	// Reject is how a reject answers: "TCP reset" or "ICMP port
	// unreachable".
	Reject  string   `json:"reject,omitempty"`
	Address Address  `json:"address"`
	Service *Service `json:"service,omitempty"`
	Source  Source   `json:"source"`
	// Policy is the traffic policy whose endpoints the packet may go to
	// (Cluster or Local), with why that one.
	Policy    string `json:"policy,omitempty"`
	PolicyWhy string `json:"policyWhy,omitempty"`
	// Topology says how topology hints narrowed the Cluster policy.
	Topology string `json:"topology,omitempty"`
	// Endpoints are all the Service port's endpoints of the packet's
	// family, chosen or not, with why; Probability is the share of new
	// connections each chosen one gets.
	Endpoints  []Endpoint   `json:"endpoints,omitempty"`
	Masquerade *Masquerade  `json:"masquerade,omitempty"`
	Affinity   *Affinity    `json:"affinity,omitempty"`
	Firewall   *SourceRange `json:"sourceRanges,omitempty"`
	// RulePath is the packet's path through the running mode's rules;
	// its Absent says why it is empty.
	RulePath RulePath `json:"rulePath"`
	// Conntrack are the entries this flow already has (same protocol and
	// original destination, and source when given).
	Conntrack      []ConntrackEntry `json:"conntrack"`
	ConntrackError string           `json:"conntrackError,omitempty"`
	// Notes are what the answer assumed or could not know.
	Notes []string `json:"notes,omitempty"`
}

// Address is which of a Service's addresses the packet is addressed to.
type Address struct {
	Kind   string `json:"kind"`
	Detail string `json:"detail"`
}

// Service names the Service port the packet is for.
type Service struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	PortName  string `json:"portName,omitempty"`
	Protocol  string `json:"protocol"`
	Port      int32  `json:"port"`
	NodePort  int32  `json:"nodePort,omitempty"`
	Type      string `json:"type"`
}

// Source says what kind of client the packet comes from, as kp's rules
// tell it: a pod (detect-local), the node itself, or elsewhere.
type Source struct {
	Address string `json:"address,omitempty"`
	// Pod is nil when kp's rules cannot tell from the address alone (the
	// interface detect-local modes).
	Pod  *bool  `json:"pod,omitempty"`
	Node bool   `json:"node"`
	Why  string `json:"why"`
	// Assumed says no --from was given: the usual client of the address
	// kind is assumed.
	Assumed bool `json:"assumed,omitempty"`
}

// Endpoint is one endpoint under the packet's traffic policy.
type Endpoint struct {
	Address     string  `json:"address"`
	Ready       bool    `json:"ready"`
	Serving     bool    `json:"serving"`
	Terminating bool    `json:"terminating"`
	NodeName    string  `json:"nodeName,omitempty"`
	Zone        string  `json:"zone,omitempty"`
	Eligible    bool    `json:"eligible"`
	Reason      string  `json:"reason"`
	Detail      string  `json:"detail"`
	Probability float64 `json:"probability,omitempty"`
	// Hairpin: the client is this endpoint, so a connection it gets is
	// masqueraded (the reply must come back through the node).
	Hairpin bool `json:"hairpin,omitempty"`
}

// Masquerade says whether the packet's source is rewritten to the node's.
type Masquerade struct {
	// Decision is "yes", "no" or "depends" (on what the address alone
	// does not tell: the interface it arrives on).
	Decision string `json:"decision"`
	Why      string `json:"why"`
}

// Affinity is ClientIP session affinity.
type Affinity struct {
	TimeoutSeconds int64 `json:"timeoutSeconds"`
	// PinnedTo is the endpoint the client's affinity entry sends it to,
	// with the entry's expiry; empty when not read (PinnedNote says why).
	PinnedTo   string `json:"pinnedTo,omitempty"`
	PinnedNote string `json:"pinnedNote,omitempty"`
}

// SourceRange is the LoadBalancer's loadBalancerSourceRanges check.
type SourceRange struct {
	Ranges []string `json:"ranges"`
	// Allowed is nil when the source is not known.
	Allowed *bool `json:"allowed,omitempty"`
}

// RulePath is the packet's path through one mode's rules.
type RulePath struct {
	Mode  string     `json:"mode"`
	Steps []RuleStep `json:"steps,omitempty"`
	// Absent says why Steps is empty.
	Absent string `json:"absent,omitempty"`
	// Note says what the path assumed or could not know (no listing to
	// take handles from, the client assumed without --from, a path that
	// depends on the random pick).
	Note string `json:"note,omitempty"`
}

// RuleStep is one rule (or map element) the packet meets.
type RuleStep struct {
	// Where is the table, chain or virtual server ("ip kp services").
	Where string `json:"where"`
	// Rule is the rule's text as listed; Handle its handle, when known.
	Rule   string `json:"rule"`
	Handle uint64 `json:"handle,omitempty"`
	// Element is the set or map element matched ("10.96.0.10 . udp . 53").
	Element string `json:"element,omitempty"`
	Verdict string `json:"verdict,omitempty"`
}

// ConntrackEntry is one conntrack entry of the flow.
type ConntrackEntry struct {
	Protocol string `json:"protocol"`
	OrigSrc  string `json:"origSrc"`
	OrigDst  string `json:"origDst"`
	ReplySrc string `json:"replySrc"`
	ReplyDst string `json:"replyDst"`
	State    string `json:"state"`
	// TimeoutSeconds is what was left of the entry's life at the snapshot.
	TimeoutSeconds int64 `json:"timeoutSeconds"`
}
