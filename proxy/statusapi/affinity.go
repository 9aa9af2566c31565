package statusapi

// AffinityEntry is one ClientIP session affinity entry: the client's next
// new connection to the service port goes to Endpoint while the entry
// lives.
type AffinityEntry struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	PortName  string `json:"portName"`
	Protocol  string `json:"protocol"`
	Client    string `json:"client"`
	Endpoint  string `json:"endpoint"`
	// Frontend is the Service address and port the entry holds for, in
	// the modes that keep one per address (ipvs); "" when it holds for all.
	Frontend string `json:"frontend,omitempty"`
	// Traffic is "internal" (ClusterIPs) or "external" (the others) for an
	// entry that holds for that traffic only (userspace); "" for all.
	Traffic string `json:"traffic,omitempty"`
	// ExpiresSeconds is what was left of the entry's life at the snapshot.
	ExpiresSeconds int64 `json:"expiresSeconds"`
}
