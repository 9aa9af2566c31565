package fromkubeproxy

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/kpproxy/kp/cmd/kp/options"
	"github.com/kpproxy/kp/proxy"
)

// Target is the mode kp will serve in: --to, else the mode kp's ConfigMap
// names, else nftables (manifests/configmap.yaml's, and auto's first).
// from says which.
func Target(to string, c *Cluster) (proxy.Target, string, error) {
	if to != "" {
		t, err := proxy.ParseTarget(to)
		return t, "--to", err
	}
	if c.KP != nil && c.KP.KC != nil && c.KP.KC.Mode != "" && c.KP.KC.Mode != "auto" {
		t, err := proxy.ParseTarget(string(c.KP.KC.Mode))
		return t, "the mode of " + c.KP.Source, err
	}
	return proxy.Target{Mode: proxy.ModeNFTables}, "kp's default: manifests/configmap.yaml's mode, and auto's first choice", nil
}

// preflight is one run: both sides and the cluster.
type preflight struct {
	c  *Cluster
	u  upstream
	kp kpSide
}

// Preflight compares, for target, what kube-proxy does with its
// configuration and what kp will do with its own: kp's ConfigMap when it
// exists, else the one Generate writes from kube-proxy's.
func Preflight(c *Cluster, target proxy.Target, targetFrom string) (*Report, error) {
	u, err := upstreamOf(c.KubeProxy.KC)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.KubeProxy.Source, err)
	}
	p := &preflight{c: c, u: u, kp: kpSide{target: target}}
	if err := p.kpSettings(); err != nil {
		return nil, err
	}
	r := &Report{
		KubeProxy: Side{Mode: string(u.mode), Config: c.KubeProxy.Source},
		KP:        Side{Mode: target.String(), ModeFrom: targetFrom, Config: p.kp.source, Generated: p.kp.generated},
	}
	r.Cluster = []Item{p.mode(), p.config(), p.apiServer(), p.masqueradeAll(), p.scheduler(), p.strictARP(), p.detectLocalMode()}
	nodes := append([]nodeFacts(nil), factsOf(c.Nodes)...)
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].name < nodes[j].name })
	for _, n := range nodes {
		r.Nodes = append(r.Nodes, NodeReport{Node: n.name, Addresses: n.addressText, PodCIDRs: n.podCIDRText, CPUs: n.cpus,
			Items: []Item{p.localhostNodePorts(n), p.nodePortAddresses(n), p.clusterCIDR(n), p.conntrack(n)}})
	}
	r.count()
	return r, nil
}

// kpSettings resolves kp's side: its ConfigMap's file, or the generated one.
func (p *preflight) kpSettings() error {
	k := &p.kp
	if cfg := p.c.KP; cfg != nil {
		k.source, k.server, k.serverFrom = cfg.Source, cfg.Server, cfg.ServerFrom
		if cfg.Err != nil {
			k.err = cfg.Err
			return nil
		}
		k.s, k.err = options.SettingsFromConfig(cfg.KC, cfg.Lenient, cfg.Source, k.target)
		return nil
	}
	g, err := Generate(p.c, k.target)
	if err != nil {
		return err
	}
	k.generated, k.server, k.serverFrom = true, g.Server, g.ServerFrom
	k.source = fmt.Sprintf("the configuration --print-config writes (ConfigMap %s/%s does not exist yet)", p.c.Namespace, p.c.KPLayout.ConfigMap)
	k.s, k.err = options.SettingsFromConfig(g.KC, nil, "the generated configuration", k.target)
	if k.err != nil {
		return fmt.Errorf("kp refuses the configuration written from kube-proxy's (a bug in --print-config): %w", k.err)
	}
	return nil
}

func (p *preflight) mode() Item {
	it := Item{ID: "mode", Severity: SeverityInfo, KubeProxy: string(p.u.mode) + " mode", KP: p.kp.target.String() + " mode"}
	if p.u.mode == p.kp.target.Mode {
		it.Severity = SeverityOK
	}
	return it
}

// config: what kp makes of its configuration file.
func (p *preflight) config() Item {
	it := Item{ID: "config", Severity: SeverityOK, KubeProxy: "reads " + p.c.KubeProxy.Source, KP: "accepts " + p.kp.source}
	if p.kp.err != nil {
		it.Severity, it.KP = SeverityError, "refuses its configuration and would not start: "+oneLine(p.kp.err)
		it.Action = "fix kp's ConfigMap, or delete it and apply the one --print-config writes"
		return it
	}
	var ignored []string
	for _, s := range p.kp.s.Ignored {
		ignored = append(ignored, s.Name+" ("+s.Reason+")")
	}
	if len(ignored) > 0 {
		it.Severity, it.KP = SeverityInfo, it.KP+"; ignores "+strings.Join(ignored, "; ")
	}
	if p.kp.generated {
		if g, err := Generate(p.c, p.kp.target); err == nil && len(g.Notes) > 0 {
			it.Severity, it.KP = SeverityInfo, it.KP+"; from kube-proxy's, "+strings.Join(g.Notes, "; ")
		}
		it.Action = "kp migrate cluster --from-kube-proxy --print-config | kubectl apply -f - (or into manifests/configmap.yaml) before kp's DaemonSet"
	}
	return it
}

func (p *preflight) apiServer() Item {
	it := Item{ID: "api-server", Severity: SeverityOK, KubeProxy: orUnknown(p.c.KubeProxy.Server, p.c.KubeProxy.ServerFrom),
		KP: orUnknown(p.kp.server, p.kp.serverFrom)}
	switch {
	case p.kp.server == "" && p.kp.err == nil:
		it.Severity = SeverityWarning
		it.KP = "reaches the API server through the kubernetes Service (" + p.kp.serverFrom + "), which only works once a node proxy has programmed it: on a fresh or rebooted node that is kp itself"
		it.Action = "give kp's kubeconfig the API server's real address (--print-config writes kube-proxy's)"
	case strings.Contains(p.kp.server, "CONTROL-PLANE-ENDPOINT"):
		it.Severity, it.Action = SeverityError, "replace manifests/configmap.yaml's placeholder with the API server's address: "+orUnknown(p.c.KubeProxy.Server, p.c.KubeProxy.ServerFrom)
	case p.c.KubeProxy.Server != "" && p.kp.server != p.c.KubeProxy.Server:
		it.Severity = SeverityInfo
	}
	return it
}

func (p *preflight) masqueradeAll() Item {
	onOff := func(b bool) string {
		if b {
			return "masquerades all traffic to Service addresses"
		}
		return "masquerades only what needs it: to ClusterIPs from outside clusterCIDR, to external addresses"
	}
	it := Item{ID: "masquerade-all", Severity: SeverityOK,
		KubeProxy: onOff(p.u.masqueradeAll) + fmt.Sprintf(" (%s.masqueradeAll %t: its mode's section)", p.u.section, p.u.masqueradeAll),
		KP:        onOff(p.kp.s.Config.MasqueradeAll)}
	if p.u.masqueradeAll != p.kp.s.Config.MasqueradeAll {
		it.Severity = SeverityWarning
		it.Action = fmt.Sprintf("set masqueradeAll: %t in kp's configuration's iptables and nftables sections (kp reads its mode's, iptables' in ipvs mode); --print-config does", p.u.masqueradeAll)
	}
	return it
}

// scheduler: how each picks an endpoint, and what an IPVS scheduler has
// for an equivalent in kp's mode.
func (p *preflight) scheduler() Item {
	it := Item{ID: "ipvs-scheduler", Severity: SeverityOK, KP: p.kp.balancing()}
	if p.u.mode != proxy.ModeIPVS {
		it.KubeProxy = "not in ipvs mode: a random endpoint, each equally likely"
		if p.kp.target.Mode == proxy.ModeIPVS || p.kp.target.Mode == proxy.ModeUserspace {
			it.Severity = SeverityInfo
		}
		return it
	}
	it.KubeProxy = "IPVS scheduler " + p.u.scheduler
	switch p.kp.target.Mode {
	case proxy.ModeIPVS:
		if s := p.kp.s.Config.IPVS.Scheduler; s != p.u.scheduler && !(s == "" && p.u.scheduler == "rr") {
			it.Severity, it.Action = SeverityWarning, "set ipvs.scheduler: "+p.u.scheduler+" in kp's configuration"
		}
	case proxy.ModeUserspace:
		if p.u.scheduler != "rr" {
			it.Severity = SeverityWarning
		}
	default:
		switch p.u.scheduler {
		case "rr":
			it.Severity = SeverityInfo
		case "sh":
			it.Severity = SeverityWarning
			it.Action = "source hashing kept each client on one endpoint: set sessionAffinity: ClientIP on the Services that need it"
		default:
			it.Severity = SeverityWarning
			it.Action = "kp's " + p.kp.target.String() + " mode has no equivalent of " + p.u.scheduler + ": it spreads at random whatever the endpoints' load; keep ipvs (--to ipvs) if the Services need it"
		}
	}
	return it
}

func (p *preflight) strictARP() Item {
	it := Item{ID: "strict-arp", Severity: SeverityOK, KubeProxy: "sets no ARP sysctl", KP: "sets no ARP sysctl"}
	kpIPVS, kpStrict := p.kp.target.Mode == proxy.ModeIPVS, p.kp.s.Config.IPVS.StrictARP
	switch {
	case p.u.mode == proxy.ModeIPVS && p.u.strictARP:
		it.KubeProxy = "sets arp_ignore=1, arp_announce=2 (ipvs.strictARP): the node answers no ARP for the Service addresses on kube-ipvs0"
	case p.u.mode == proxy.ModeIPVS:
		it.KubeProxy = "leaves ARP as is (ipvs.strictARP false): the node answers ARP for the Service addresses on kube-ipvs0"
	}
	switch {
	case kpIPVS && kpStrict:
		it.KP = "sets arp_ignore=1, arp_announce=2 (ipvs.strictARP) for kp-ipvs0's addresses"
	case kpIPVS:
		it.KP = "leaves ARP as is (ipvs.strictARP false): the node answers ARP for the Service addresses on kp-ipvs0"
		if p.u.mode != proxy.ModeIPVS || p.u.strictARP {
			it.Severity = SeverityWarning
		}
		it.Action = "MetalLB's L2 mode (and any load balancer that announces Service IPs by ARP) needs ipvs.strictARP: true with ipvs"
	case p.u.mode == proxy.ModeIPVS && p.u.strictARP:
		it.Severity = SeverityInfo
		it.KP = "no dummy interface holds Service addresses in " + p.kp.target.String() + " mode: nothing to hide from ARP; the values kube-proxy set stay until the node reboots"
	}
	return it
}

// detectLocalMode: how each tells a pod's traffic from other clients'
// (detectLocalMode with the interface it reads): kp's ConfigMap, or the
// one --print-config writes from kube-proxy's, may say another way.
func (p *preflight) detectLocalMode() Item {
	kube, kp := p.u.local(), p.kp.local()
	it := Item{ID: "detect-local-mode", Severity: SeverityOK, KubeProxy: "tells pods' traffic by " + kube.String(),
		KP: "tells pods' traffic by " + kp.String()}
	if kp.iface != "" && p.kp.target.Mode == proxy.ModeUserspace {
		it.KP += "; the userspace mode, which proxies connections rather than packets, by the interface the node routes the client through"
	}
	if kube != kp {
		it.Severity = SeverityWarning
		it.Action = "set " + kube.setting() + " in kp's configuration (--print-config writes kube-proxy's): what is local decides " +
			"which ClusterIP traffic is masqueraded and which may go to any endpoint of an externalTrafficPolicy: Local Service"
	}
	return it
}

// localMode is a detect-local mode with the interface it reads: the
// bridge (BridgeInterface) or the name prefix (InterfaceNamePrefix).
type localMode struct {
	mode  proxy.LocalMode // ClusterCIDR when unset, as upstream
	iface string
}

func localModeOf(mode proxy.LocalMode, d options.DetectLocalConfiguration) localMode {
	switch mode {
	case "":
		mode = proxy.LocalModeClusterCIDR
	case proxy.LocalModeBridgeInterface:
		return localMode{mode: mode, iface: d.BridgeInterface}
	case proxy.LocalModeInterfaceNamePrefix:
		return localMode{mode: mode, iface: d.InterfaceNamePrefix}
	}
	return localMode{mode: mode}
}

func (l localMode) String() string {
	switch l.mode {
	case proxy.LocalModeNodeCIDR:
		return "the node's podCIDRs (detectLocalMode NodeCIDR)"
	case proxy.LocalModeBridgeInterface:
		return "the bridge it comes in on, " + orNone(l.iface) + " (detectLocalMode BridgeInterface)"
	case proxy.LocalModeInterfaceNamePrefix:
		name := "none"
		if l.iface != "" {
			name = l.iface + "*"
		}
		return "the interface it comes in on, named " + name + " (detectLocalMode InterfaceNamePrefix)"
	case proxy.LocalModeClusterCIDR:
		return "clusterCIDR (detectLocalMode ClusterCIDR)"
	}
	return "no way: detectLocalMode " + string(l.mode) + " is not a detect-local mode"
}

// setting is l as a KubeProxyConfiguration says it.
func (l localMode) setting() string {
	switch l.mode {
	case proxy.LocalModeBridgeInterface:
		return "detectLocalMode: BridgeInterface and detectLocal.bridgeInterface: " + l.iface
	case proxy.LocalModeInterfaceNamePrefix:
		return "detectLocalMode: InterfaceNamePrefix and detectLocal.interfaceNamePrefix: " + l.iface
	}
	return "detectLocalMode: " + string(l.mode)
}

func orUnknown(server, from string) string {
	if server == "" {
		return "unknown: " + from
	}
	return server + " (from " + from + ")"
}

// oneLine joins a joined error's lines.
func oneLine(err error) string {
	var j interface{ Unwrap() []error }
	if errors.As(err, &j) {
		var parts []string
		for _, e := range j.Unwrap() {
			parts = append(parts, e.Error())
		}
		return strings.Join(parts, "; ")
	}
	return err.Error()
}
