package fromkubeproxy

import (
	"net/netip"

	"github.com/kpproxy/kp/cmd/kp/options"
	"github.com/kpproxy/kp/proxy"
)

// kpSide is what kp will do in the target mode: its settings
// (options.SettingsFromConfig, kp proxy's own merge) read through the
// rules of its backends, each named where it is kept.
type kpSide struct {
	target proxy.Target
	s      options.Settings
	// err: kp refuses the configuration (it would exit at start).
	err error
	// source names the configuration; generated: it is the one
	// --print-config writes, kp's ConfigMap does not exist yet.
	source    string
	generated bool
	server    string
	// serverFrom says where server was read (or why it is unknown).
	serverFrom string
}

// nodePorts is where kp's NodePorts answer: with CIDRs, the local
// addresses in them; with primary, the addresses the Node lists; else
// every local address. The nftables mode without CIDRs always takes the
// Node's addresses (nft/nodeport.go).
func (k kpSide) nodePorts() (primary bool, cidrs []netip.Prefix) {
	c := k.s.Config
	if len(c.NodePortAddresses) > 0 {
		return false, c.NodePortAddresses
	}
	return c.NodePortPrimary || k.target.Mode == proxy.ModeNFTables, nil
}

// localhost says whether kp answers IPv4 NodePorts on 127.0.0.1: the
// iptables mode as upstream's (legacy/iptables checkLocalhost: with
// localhostNodePorts, NodePorts on every address or on CIDRs holding
// loopback, route_localnet=1); the userspace mode wherever its redirect
// matches a local destination, loopback included; never nftables (it
// cannot DNAT loopback) nor ipvs (loopback gets no virtual server).
func (k kpSide) localhost() bool {
	primary, cidrs := k.nodePorts()
	switch k.target.Mode {
	case proxy.ModeIPTables:
		return k.s.Config.LocalhostNodePorts && !primary && holdsLoopback(cidrs)
	case proxy.ModeUserspace:
		return !primary && holdsLoopback(cidrs)
	}
	return false
}

// local is how kp tells a pod's traffic (proxy.Config's DetectLocal, which
// the backends ask through LocalCIDRs and LocalInterface).
func (k kpSide) local() localMode {
	d := k.s.Config.DetectLocal
	return localModeOf(d.Mode, options.DetectLocalConfiguration{BridgeInterface: d.BridgeInterface, InterfaceNamePrefix: d.InterfaceNamePrefix})
}

// balancing is how kp picks an endpoint in its mode.
func (k kpSide) balancing() string {
	switch k.target.Mode {
	case proxy.ModeIPVS:
		s := k.s.Config.IPVS.Scheduler
		if s == "" {
			s = "rr"
		}
		return "IPVS scheduler " + s
	case proxy.ModeUserspace:
		return "round robin (userspace mode)"
	case proxy.ModeIPTables:
		return "a random endpoint, each equally likely (iptables statistic random)"
	}
	return "a random endpoint, each equally likely (nftables numgen random)"
}
