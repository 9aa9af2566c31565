package proxy

import "context"

// Mode names a proxy backend, with upstream kube-proxy's spelling.
type Mode string

const (
	ModeNFTables  Mode = "nftables"
	ModeIPTables  Mode = "iptables"
	ModeIPVS      Mode = "ipvs"
	ModeUserspace Mode = "userspace"
)

// Backend turns States into kernel forwarding state. Every mode implements it.
type Backend interface {
	Mode() Mode
	// Probe reports whether this kernel can run the mode; it drives fallback.
	Probe(ctx context.Context) error
	// Sync makes the kernel match s, atomically. A backend may sync only
	// s.Changed when its previous Sync succeeded; after a failure it must
	// reconcile everything on the next call.
	Sync(ctx context.Context, s *State) error
	// Cleanup removes everything this mode ever wrote.
	Cleanup(ctx context.Context) error
}
