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

	// ClusterCIDRs: traffic to a ClusterIP from outside these is masqueraded.
	ClusterCIDRs []netip.Prefix
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

	MetricsBindAddress string
	HealthzBindAddress string
	// Profiling serves Go's profiles at /debug/pprof/ on the metrics
	// server (upstream --profiling).
	Profiling bool

	// AllowModeNone lets the Node annotation kpproxy.io/proxy-mode=none
	// switch kp to ModeNone (kp's --allow-mode-none; kp migrate cluster
	// --rollback needs it). Without it the annotation is refused, with an
	// Event on the Node: whoever may patch Nodes could otherwise take the
	// node's Services offline.
	AllowModeNone bool
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
