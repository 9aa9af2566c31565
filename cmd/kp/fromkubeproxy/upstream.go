package fromkubeproxy

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/kpproxy/kp/cmd/kp/options"
	"github.com/kpproxy/kp/conntrack"
	"github.com/kpproxy/kp/proxy"
)

// upstream is what kube-proxy (v1.36) does with a KubeProxyConfiguration:
// upstream's rules, not kp's. References are to kubernetes' source:
// cmd/kube-proxy/app/server_linux.go (platformApplyDefaults, createProxier,
// setupConntrack), pkg/proxy/apis/config/v1alpha1 (defaults.go,
// conversion.go) and the proxiers.
type upstream struct {
	mode proxy.Mode
	// NodePorts answer on the local addresses in nodePortCIDRs; with
	// nodePortPrimary on the Node's first address of each family; with
	// neither on every local address.
	nodePortCIDRs   []netip.Prefix
	nodePortPrimary bool
	// localhost: IPv4 NodePorts answer on 127.0.0.1 too (route_localnet=1).
	localhost bool
	// section is the mode's section of the file, whose masqueradeAll,
	// masqueradeBit and sync periods apply (conversion.go).
	section       string
	masqueradeAll bool
	masqueradeBit *int32
	sync, minSync time.Duration
	scheduler     string
	strictARP     bool
	// detectLocalMode is ClusterCIDR when unset (platformApplyDefaults);
	// the interface modes read detectLocal's bridgeInterface and
	// interfaceNamePrefix.
	detectLocalMode string
	detectLocal     options.DetectLocalConfiguration
	clusterCIDRs    []netip.Prefix
	conntrack       conntrack.Tuning
}

// upstreamOf reads kc as kube-proxy does.
func upstreamOf(kc *options.KubeProxyConfiguration) (upstream, error) {
	u := upstream{mode: proxy.Mode(kc.Mode), detectLocalMode: string(kc.DetectLocalMode), detectLocal: kc.DetectLocal,
		scheduler: kc.IPVS.Scheduler, strictARP: kc.IPVS.StrictARP}
	switch u.mode {
	case "": // platformApplyDefaults: iptables on Linux
		u.mode = proxy.ModeIPTables
	case proxy.ModeIPTables, proxy.ModeIPVS, proxy.ModeNFTables:
	default:
		return u, fmt.Errorf("kube-proxy's mode %q: not a Linux mode (iptables, ipvs, nftables)", kc.Mode)
	}
	if u.detectLocalMode == "" {
		u.detectLocalMode = "ClusterCIDR"
	}
	if u.scheduler == "" {
		u.scheduler = "rr" // the ipvs proxier's default
	}
	// conversion.go: the nftables mode reads the nftables section, the
	// others the iptables one; the sync periods come from ipvs's in ipvs
	// mode.
	u.section, u.masqueradeAll, u.masqueradeBit = "iptables", kc.IPTables.MasqueradeAll, kc.IPTables.MasqueradeBit
	u.sync, u.minSync = kc.IPTables.SyncPeriod.Duration, kc.IPTables.MinSyncPeriod.Duration
	switch u.mode {
	case proxy.ModeNFTables:
		u.section, u.masqueradeAll, u.masqueradeBit = "nftables", kc.NFTables.MasqueradeAll, kc.NFTables.MasqueradeBit
		u.sync, u.minSync = kc.NFTables.SyncPeriod.Duration, kc.NFTables.MinSyncPeriod.Duration
	case proxy.ModeIPVS:
		u.sync, u.minSync = kc.IPVS.SyncPeriod.Duration, kc.IPVS.MinSyncPeriod.Duration
	}
	var err error
	if u.clusterCIDRs, err = parsePrefixes(strings.Split(kc.ClusterCIDR, ",")); err != nil {
		return u, fmt.Errorf("kube-proxy's clusterCIDR %q: %w", kc.ClusterCIDR, err)
	}
	for _, a := range kc.NodePortAddresses {
		u.nodePortPrimary = u.nodePortPrimary || strings.TrimSpace(a) == "primary"
	}
	if !u.nodePortPrimary {
		if u.nodePortCIDRs, err = parsePrefixes(kc.NodePortAddresses); err != nil {
			return u, fmt.Errorf("kube-proxy's nodePortAddresses %q: %w", kc.NodePortAddresses, err)
		}
	}
	// platformApplyDefaults: the nftables mode's default is "primary".
	if u.mode == proxy.ModeNFTables && len(u.nodePortCIDRs) == 0 {
		u.nodePortPrimary = true
	}
	// The iptables proxier answers on 127.0.0.1 when localhostNodePorts
	// (true by default) and the NodePort addresses hold IPv4 loopback
	// (ContainsIPv4Loopback: every address, or a CIDR with 127.0.0.1); the
	// other modes never do.
	u.localhost = u.mode == proxy.ModeIPTables && (kc.IPTables.LocalhostNodePorts == nil || *kc.IPTables.LocalhostNodePorts) &&
		!u.nodePortPrimary && holdsLoopback(u.nodePortCIDRs)
	u.conntrack = upstreamConntrack(kc.Conntrack)
	return u, nil
}

// local is how kube-proxy tells a pod's traffic.
func (u upstream) local() localMode {
	return localModeOf(proxy.LocalMode(u.detectLocalMode), u.detectLocal)
}

// upstreamConntrack is the conntrack section with upstream's defaults
// (conntrack.DefaultTuning: a nil field is the default, a zero duration
// leaves the kernel's value).
func upstreamConntrack(c options.KubeProxyConntrackConfiguration) conntrack.Tuning {
	t := conntrack.DefaultTuning()
	if c.MaxPerCore != nil {
		t.MaxPerCore = *c.MaxPerCore
	}
	if c.Min != nil {
		t.Min = *c.Min
	}
	if c.TCPEstablishedTimeout != nil {
		t.TCPEstablishedTimeout = c.TCPEstablishedTimeout.Duration
	}
	if c.TCPCloseWaitTimeout != nil {
		t.TCPCloseWaitTimeout = c.TCPCloseWaitTimeout.Duration
	}
	t.TCPBeLiberal, t.UDPTimeout, t.UDPStreamTimeout = c.TCPBeLiberal, c.UDPTimeout.Duration, c.UDPStreamTimeout.Duration
	return t
}

// holdsLoopback: NodePorts restricted to cidrs (none: every address)
// answer on 127.0.0.1.
func holdsLoopback(cidrs []netip.Prefix) bool {
	if len(cidrs) == 0 {
		return true
	}
	for _, p := range cidrs {
		if p.Contains(netip.MustParseAddr("127.0.0.1")) {
			return true
		}
	}
	return false
}

// parsePrefixes parses CIDRs, skipping empty items; host bits are allowed
// (upstream means the network).
func parsePrefixes(items []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, it := range items {
		if it = strings.TrimSpace(it); it == "" {
			continue
		}
		p, err := netip.ParsePrefix(it)
		if err != nil {
			return nil, fmt.Errorf("invalid CIDR %q", it)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
