package proxy

import (
	"fmt"
	"net/netip"
	"time"
)

// Config is kp proxy's effective configuration, after flags and the
// KubeProxyConfiguration file are merged (cmd/kp does that).
type Config struct {
	Mode             Mode
	HostnameOverride string
	// Kubeconfig and Master select the API server; both empty with
	// ManifestsDir set means the folder source.
	Kubeconfig   string
	Master       string
	ManifestsDir string

	// ClusterCIDRs: traffic to a ClusterIP from outside these is masqueraded
	// (when DetectLocal's mode is ClusterCIDR, the default).
	ClusterCIDRs []netip.Prefix
	// DetectLocal says which traffic comes from this node's pods ("local"):
	// traffic to a ClusterIP from elsewhere is masqueraded, and with
	// externalTrafficPolicy Local, local traffic to an external address
	// may go to any endpoint. Backends ask LocalCIDRs and LocalInterface.
	DetectLocal DetectLocal
	// IgnoreExternalIPs leaves Services' externalIPs unproxied (upstream's
	// feature gate AllowServiceExternalIPs=false).
	IgnoreExternalIPs bool
	// NodePortAddresses are CIDRs restricting where NodePorts answer; the
	// special value "primary" is kept in NodePortPrimary.
	NodePortAddresses []netip.Prefix
	NodePortPrimary   bool
	// ServiceCIDRs are Service CIDRs known without ServiceCIDR objects
	// (kp's --service-cidrs), for the folder source above all.
	ServiceCIDRs  []netip.Prefix
	MasqueradeAll bool
	MasqueradeBit int

	// IPTablesBackend is the iptables mode's flavor: "auto" (or empty:
	// detected as upstream's iptables-wrapper does), "nft" or "legacy".
	IPTablesBackend string
	// LocalhostNodePorts lets the iptables mode answer IPv4 NodePorts on
	// 127.0.0.0/8 (upstream --iptables-localhost-nodeports).
	LocalhostNodePorts bool

	// The userspace mode's settings (kp's own flags; upstream removed the
	// mode). UserspaceRedirect is how Service traffic reaches its
	// listeners: "auto" (or empty: nftables when the kernel runs it, else
	// iptables), "nftables" or "iptables".
	UserspaceRedirect string
	// UserspaceMaxConnections caps the TCP connections proxied at once per
	// service port; past it new ones are refused (reset). 0: no cap.
	UserspaceMaxConnections int
	// UserspaceTCPIdleTimeout ends a proxied TCP connection that carried
	// nothing either way for this long. 0: never.
	UserspaceTCPIdleTimeout time.Duration
	// UserspaceUDPIdleTimeout ends a UDP session that carried nothing
	// either way for this long. 0: the mode's default.
	UserspaceUDPIdleTimeout time.Duration

	// IPVS holds the ipvs mode's settings (upstream's --ipvs-* flags and
	// the config file's ipvs section).
	IPVS IPVSConfig

	SyncPeriod       time.Duration // periodic resync (upstream --sync-period)
	MinSyncPeriod    time.Duration // upstream --min-sync-period
	ConfigSyncPeriod time.Duration // upstream --config-sync-period; no effect (no informer cache)
	// DriftCheckPeriod is how often the iptables, ipvs and userspace
	// modes compare their rules in the kernel with what kp wrote, to
	// repair what other processes changed (kp's --drift-check-period);
	// the nftables mode hears of such changes from the kernel at once. 0
	// turns drift repair off in every mode.
	DriftCheckPeriod time.Duration

	MetricsBindAddress string
	HealthzBindAddress string
	// Profiling serves Go's profiles at /debug/pprof/ on the metrics
	// server (upstream --profiling).
	Profiling bool
	// StatusSocket is the Unix socket of kp's status API (status,
	// services, inventory, mode switches, profiles), which only root on the
	// node may open: the socket is mode 0600 in a directory kp makes 0700.
	// Empty: no status API. None of it is served on the network.
	StatusSocket string

	// AllowModeNone lets the Node annotation kpproxy.io/proxy-mode=none
	// switch kp to ModeNone (kp's --allow-mode-none; kp migrate cluster
	// --rollback needs it). Without it the annotation is refused, with an
	// Event on the Node: whoever may patch Nodes could otherwise take the
	// node's Services offline.
	AllowModeNone bool
}

// LocalMode is upstream's detectLocalMode: how local traffic is told apart.
type LocalMode string

// Upstream's detect-local modes; "" is ClusterCIDR.
const (
	LocalModeClusterCIDR         LocalMode = "ClusterCIDR"
	LocalModeNodeCIDR            LocalMode = "NodeCIDR"
	LocalModeBridgeInterface     LocalMode = "BridgeInterface"
	LocalModeInterfaceNamePrefix LocalMode = "InterfaceNamePrefix"
)

// DetectLocal is upstream's detectLocalMode with what each mode reads.
type DetectLocal struct {
	Mode LocalMode
	// PodCIDRs are the Node's spec.podCIDRs, for NodeCIDR (cmd/kp reads
	// them before the backend starts, as upstream does).
	PodCIDRs []netip.Prefix
	// BridgeInterface (BridgeInterface) and InterfaceNamePrefix
	// (InterfaceNamePrefix) are the interfaces local traffic arrives on.
	BridgeInterface     string
	InterfaceNamePrefix string
}

// LocalCIDRs are the source ranges of local traffic: the cluster CIDRs
// (ClusterCIDR) or the node's pod CIDRs (NodeCIDR), at most one per family
// as upstream takes them; none in the interface modes.
func (c Config) LocalCIDRs() []netip.Prefix {
	var cidrs []netip.Prefix
	switch c.DetectLocal.Mode {
	case "", LocalModeClusterCIDR:
		cidrs = c.ClusterCIDRs
	case LocalModeNodeCIDR:
		cidrs = c.DetectLocal.PodCIDRs
	default:
		return nil
	}
	var out []netip.Prefix
	seen4, seen6 := false, false
	for _, p := range cidrs {
		seen := &seen4
		if !p.Addr().Is4() {
			seen = &seen6
		}
		if !*seen {
			*seen = true
			out = append(out, p)
		}
	}
	return out
}

// LocalInterface is the interface local traffic arrives on, in the
// interface modes: a name (BridgeInterface), or a prefix every such
// interface's name starts with (InterfaceNamePrefix, prefix true). ok is
// false in the CIDR modes.
func (c Config) LocalInterface() (name string, prefix, ok bool) {
	switch c.DetectLocal.Mode {
	case LocalModeBridgeInterface:
		return c.DetectLocal.BridgeInterface, false, true
	case LocalModeInterfaceNamePrefix:
		return c.DetectLocal.InterfaceNamePrefix, true, true
	}
	return "", false, false
}

// MasqueradeMark is the packet mark bit of MasqueradeBit, which flags a
// packet for masquerading in every mode.
func (c Config) MasqueradeMark() (uint32, error) {
	if c.MasqueradeBit < 0 || c.MasqueradeBit > 31 {
		return 0, fmt.Errorf("masquerade bit %d: must be within 0..31", c.MasqueradeBit)
	}
	return 1 << uint(c.MasqueradeBit), nil
}

// IPVSConfig is the ipvs mode's part of Config, with upstream's meanings.
type IPVSConfig struct {
	// Scheduler is the IPVS scheduler of every virtual server (rr when
	// empty): rr, wrr, lc, wlc, lblc, lblcr, sh, dh, sed, nq, mh.
	Scheduler string
	// StrictARP sets arp_ignore=1 and arp_announce=2, so the node does not
	// answer ARP for the Service addresses its dummy interface holds.
	StrictARP bool
	// ExcludeCIDRs are ranges whose virtual servers kp never deletes
	// (other programs' IPVS services).
	ExcludeCIDRs []netip.Prefix
	// TCPTimeout, TCPFinTimeout and UDPTimeout set IPVS's connection
	// timeouts (0 keeps the kernel's).
	TCPTimeout, TCPFinTimeout, UDPTimeout time.Duration
}
