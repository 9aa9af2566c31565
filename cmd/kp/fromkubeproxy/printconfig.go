package fromkubeproxy

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/kpproxy/kp/cmd/kp/options"
	"github.com/kpproxy/kp/proxy"
)

// Generated is kp's configuration written from kube-proxy's: what kp reads
// (KC, with the API server's address in its kubeconfig), and notes on what
// was not carried over and where values came from.
type Generated struct {
	KC *options.KubeProxyConfiguration
	// Server is the API server's address, ServerFrom where it was read.
	Server, ServerFrom string
	// ClusterCIDRFrom says where clusterCIDR came from when kube-proxy's
	// configuration had none ("" when it did).
	ClusterCIDRFrom string
	// Notes say what was left out and why, one line each.
	Notes []string

	namespace string
	layout    Layout
	source    string
}

// Generate writes kp's configuration for target from kube-proxy's: every
// setting kp acts on, with the mode's settings in every mode's section
// (kp reads the section of the mode it runs, and may be switched to
// another), conntrack's written out in full (kp sets what kube-proxy set),
// clusterCIDR from kube-proxy's or else the cluster's pod subnet.
func Generate(c *Cluster, target proxy.Target) (*Generated, error) {
	kp := c.KubeProxy.KC
	u, err := upstreamOf(kp)
	if err != nil {
		return nil, err
	}
	g := &Generated{KC: &options.KubeProxyConfiguration{}, namespace: c.Namespace, layout: c.KPLayout, source: c.KubeProxy.Source}
	out := g.KC
	out.APIVersion, out.Kind = "kubeproxy.config.k8s.io/v1alpha1", "KubeProxyConfiguration"
	out.Mode = options.ProxyMode(target.Mode)
	out.ClientConnection.Kubeconfig = c.KPLayout.KubeconfigPath
	out.ClusterCIDR = kp.ClusterCIDR
	if out.ClusterCIDR == "" {
		out.ClusterCIDR, g.ClusterCIDRFrom = clusterCIDRHint(c)
	}
	out.NodePortAddresses = slices.Clone(kp.NodePortAddresses)
	out.HealthzBindAddress, out.MetricsBindAddress = kp.HealthzBindAddress, kp.MetricsBindAddress
	if out.HealthzBindAddress == "" {
		out.HealthzBindAddress = "0.0.0.0:10256"
	}
	if out.MetricsBindAddress == "" {
		out.MetricsBindAddress = "127.0.0.1:10249"
	}
	out.EnableProfiling = kp.EnableProfiling
	out.IPTables = options.KubeProxyIPTablesConfiguration{MasqueradeAll: u.masqueradeAll, MasqueradeBit: u.masqueradeBit,
		LocalhostNodePorts: kp.IPTables.LocalhostNodePorts, SyncPeriod: metav1.Duration{Duration: u.sync}, MinSyncPeriod: metav1.Duration{Duration: u.minSync}}
	out.NFTables = options.KubeProxyNFTablesConfiguration{MasqueradeAll: u.masqueradeAll, MasqueradeBit: u.masqueradeBit,
		SyncPeriod: metav1.Duration{Duration: u.sync}, MinSyncPeriod: metav1.Duration{Duration: u.minSync}}
	out.IPVS = kp.IPVS
	out.IPVS.SyncPeriod, out.IPVS.MinSyncPeriod = metav1.Duration{Duration: u.sync}, metav1.Duration{Duration: u.minSync}
	t := u.conntrack
	out.Conntrack = options.KubeProxyConntrackConfiguration{MaxPerCore: &t.MaxPerCore, Min: &t.Min,
		TCPEstablishedTimeout: &metav1.Duration{Duration: t.TCPEstablishedTimeout}, TCPCloseWaitTimeout: &metav1.Duration{Duration: t.TCPCloseWaitTimeout},
		TCPBeLiberal: t.TCPBeLiberal, UDPTimeout: metav1.Duration{Duration: t.UDPTimeout}, UDPStreamTimeout: metav1.Duration{Duration: t.UDPStreamTimeout}}
	g.notDropped(kp)
	g.Server, g.ServerFrom = c.KubeProxy.Server, c.KubeProxy.ServerFrom
	if g.Server == "" {
		g.Server, g.ServerFrom = c.Server, "the address this command reached the API server at ("+c.KubeProxy.ServerFrom+")"
	}
	return g, nil
}

// notDropped carries the settings kp takes only in some forms, and notes
// the ones left out.
func (g *Generated) notDropped(kp *options.KubeProxyConfiguration) {
	out := g.KC
	switch ip, err := netip.ParseAddr(kp.BindAddress); {
	case kp.BindAddress == "":
	case err == nil && ip.IsUnspecified():
		out.BindAddress = kp.BindAddress
	default:
		g.Notes = append(g.Notes, fmt.Sprintf("bindAddress %s left out: kp takes the node's IPs from its Node object", kp.BindAddress))
	}
	g.detectLocal(kp)
	// kp takes every gate kube-proxy takes (it honours those that change a
	// proxy and logs the rest as ignored); gates kube-proxy would refuse
	// too are left out, or kp would refuse the whole file.
	if err := options.CheckFeatureGates(kp.FeatureGates); len(kp.FeatureGates) > 0 && err == nil {
		out.FeatureGates = maps.Clone(kp.FeatureGates)
	} else if err != nil {
		for _, name := range slices.Sorted(maps.Keys(kp.FeatureGates)) {
			g.Notes = append(g.Notes, fmt.Sprintf("featureGates %s=%t left out: kube-proxy v1.36 refuses these gates too (%v)", name, kp.FeatureGates[name], err))
		}
	}
	for _, f := range []struct {
		field string
		set   bool
		why   string
	}{
		{"oomScoreAdj", kp.OOMScoreAdj != nil, "kp leaves its OOM score to the pod"},
		{"portRange", kp.PortRange != "", "no kp mode uses it"},
		{"winkernel", kp.Winkernel != options.KubeProxyWinkernelConfiguration{}, "Windows only"},
		{"logging", kp.Logging.Format != "" || kp.Logging.Verbosity != 0 || len(kp.Logging.VModule) > 0, "kp's logging is its own (--log-format, -v)"},
		{"clientConnection qps/burst/contentType", kp.ClientConnection.QPS != 0 || kp.ClientConnection.Burst != 0 || kp.ClientConnection.ContentType != "",
			"kp sets its own API client rate limits"},
	} {
		if f.set {
			g.Notes = append(g.Notes, f.field+" left out: "+f.why)
		}
	}
}

// detectLocal carries how kube-proxy tells a pod's traffic (kp has every
// detect-local mode, in every mode): detectLocalMode and the detectLocal
// section, unless kube-proxy's validation refuses the mode too (an unknown
// one, an interface mode without its interface), which would make kp
// refuse the whole file.
func (g *Generated) detectLocal(kp *options.KubeProxyConfiguration) {
	mode, d := proxy.LocalMode(kp.DetectLocalMode), kp.DetectLocal
	var missing string
	switch mode {
	case "", proxy.LocalModeClusterCIDR, proxy.LocalModeNodeCIDR:
	case proxy.LocalModeBridgeInterface:
		if d.BridgeInterface == "" {
			missing = "detectLocal.bridgeInterface"
		}
	case proxy.LocalModeInterfaceNamePrefix:
		if d.InterfaceNamePrefix == "" {
			missing = "detectLocal.interfaceNamePrefix"
		}
	default:
		g.Notes = append(g.Notes, fmt.Sprintf("detectLocalMode %s left out: not a detect-local mode (kube-proxy refuses it too)", mode))
		return
	}
	if missing != "" {
		g.Notes = append(g.Notes, fmt.Sprintf("detectLocalMode %s left out: %s is empty (kube-proxy refuses that too)", mode, missing))
		return
	}
	g.KC.DetectLocalMode, g.KC.DetectLocal = kp.DetectLocalMode, d
}

// clusterCIDRHint is the cluster's clusterCIDR: kube-proxy's, else
// kubeadm's pod subnet, else the smallest CIDR of each family that covers
// every node's podCIDRs.
func clusterCIDRHint(c *Cluster) (string, string) {
	if s := c.KubeProxy.KC.ClusterCIDR; s != "" {
		return s, "kube-proxy's clusterCIDR"
	}
	if c.PodSubnet != "" {
		return c.PodSubnet, "kubeadm-config's networking.podSubnet"
	}
	var cover []netip.Prefix
	for _, f := range []proxy.Family{proxy.IPv4, proxy.IPv6} {
		var p netip.Prefix
		for _, n := range c.Nodes {
			for _, s := range n.Spec.PodCIDRs {
				q, err := netip.ParsePrefix(s)
				if err != nil || !f.Has(q.Addr()) {
					continue
				}
				if !p.IsValid() {
					p = q.Masked()
				}
				for p.Bits() > q.Bits() || !p.Contains(q.Addr()) {
					p = netip.PrefixFrom(p.Addr(), p.Bits()-1).Masked()
				}
			}
		}
		if p.IsValid() {
			cover = append(cover, p)
		}
	}
	if len(cover) == 0 {
		return "", ""
	}
	s := make([]string, len(cover))
	for i, p := range cover {
		s[i] = p.String()
	}
	return strings.Join(s, ","), fmt.Sprintf("the smallest CIDR covering the %d nodes' podCIDRs: check it covers the nodes to come", len(c.Nodes))
}

// ConfigMap writes g as kp's ConfigMap, ready for kubectl apply.
func (g *Generated) ConfigMap() (string, error) {
	conf, err := yaml.Marshal(fileOf(g.KC))
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# kp's ConfigMap, written by kp migrate cluster --from-kube-proxy --print-config\n# from %s.\n", g.source)
	fmt.Fprintf(&b, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: %s\n  namespace: %s\ndata:\n", g.layout.ConfigMap, g.namespace)
	fmt.Fprintf(&b, "  %s: |\n", g.layout.Key)
	var head []string
	if g.ClusterCIDRFrom != "" {
		head = append(head, "clusterCIDR from "+g.ClusterCIDRFrom+".")
	}
	head = append(head, g.Notes...)
	for _, l := range head {
		fmt.Fprintf(&b, "    # %s\n", l)
	}
	for _, l := range strings.Split(strings.TrimRight(string(conf), "\n"), "\n") {
		fmt.Fprintf(&b, "    %s\n", l)
	}
	fmt.Fprintf(&b, "  %s: |\n", g.layout.KubeconfigKey)
	fmt.Fprintf(&b, "    # The API server from %s.\n", g.ServerFrom)
	for _, l := range strings.Split(fmt.Sprintf(kubeconfigTemplate, strconv.Quote(g.Server)), "\n") {
		fmt.Fprintf(&b, "    %s\n", l)
	}
	return b.String(), nil
}

// kubeconfigTemplate is manifests/configmap.yaml's kubeconfig: the API
// server's real address, the pod's service account token.
const kubeconfigTemplate = `apiVersion: v1
kind: Config
clusters:
  - name: default
    cluster:
      server: %s
      certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
users:
  - name: default
    user:
      tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
contexts:
  - name: default
    context:
      cluster: default
      user: default
current-context: default`

// fileOf is kc with only the fields that are set, for a file a person
// reads: the mirror type writes every field, Windows' included.
func fileOf(kc *options.KubeProxyConfiguration) map[string]any {
	m := map[string]any{"apiVersion": kc.APIVersion, "kind": kc.Kind}
	put := func(into map[string]any, key string, v any, set bool) {
		if set {
			into[key] = v
		}
	}
	put(m, "mode", kc.Mode, kc.Mode != "")
	put(m, "clusterCIDR", kc.ClusterCIDR, kc.ClusterCIDR != "")
	put(m, "nodePortAddresses", kc.NodePortAddresses, len(kc.NodePortAddresses) > 0)
	put(m, "detectLocalMode", kc.DetectLocalMode, kc.DetectLocalMode != "")
	local := map[string]any{}
	put(local, "bridgeInterface", kc.DetectLocal.BridgeInterface, kc.DetectLocal.BridgeInterface != "")
	put(local, "interfaceNamePrefix", kc.DetectLocal.InterfaceNamePrefix, kc.DetectLocal.InterfaceNamePrefix != "")
	put(m, "detectLocal", local, len(local) > 0)
	put(m, "bindAddress", kc.BindAddress, kc.BindAddress != "")
	put(m, "healthzBindAddress", kc.HealthzBindAddress, true)
	put(m, "metricsBindAddress", kc.MetricsBindAddress, true)
	put(m, "enableProfiling", true, kc.EnableProfiling)
	put(m, "featureGates", kc.FeatureGates, len(kc.FeatureGates) > 0)
	m["clientConnection"] = map[string]any{"kubeconfig": kc.ClientConnection.Kubeconfig}
	mode := func(masqAll bool, bit *int32, sync, minSync time.Duration) map[string]any {
		s := map[string]any{}
		put(s, "masqueradeAll", true, masqAll)
		put(s, "masqueradeBit", bit, bit != nil)
		put(s, "syncPeriod", sync.String(), sync != 0)
		put(s, "minSyncPeriod", minSync.String(), minSync != 0)
		return s
	}
	ipt := mode(kc.IPTables.MasqueradeAll, kc.IPTables.MasqueradeBit, kc.IPTables.SyncPeriod.Duration, kc.IPTables.MinSyncPeriod.Duration)
	put(ipt, "localhostNodePorts", kc.IPTables.LocalhostNodePorts, kc.IPTables.LocalhostNodePorts != nil)
	put(m, "iptables", ipt, len(ipt) > 0)
	nft := mode(kc.NFTables.MasqueradeAll, kc.NFTables.MasqueradeBit, kc.NFTables.SyncPeriod.Duration, kc.NFTables.MinSyncPeriod.Duration)
	put(m, "nftables", nft, len(nft) > 0)
	v := kc.IPVS
	ipvs := mode(false, nil, v.SyncPeriod.Duration, v.MinSyncPeriod.Duration)
	put(ipvs, "scheduler", v.Scheduler, v.Scheduler != "")
	put(ipvs, "strictARP", true, v.StrictARP)
	put(ipvs, "excludeCIDRs", v.ExcludeCIDRs, len(v.ExcludeCIDRs) > 0)
	for key, d := range map[string]time.Duration{"tcpTimeout": v.TCPTimeout.Duration, "tcpFinTimeout": v.TCPFinTimeout.Duration, "udpTimeout": v.UDPTimeout.Duration} {
		put(ipvs, key, d.String(), d != 0)
	}
	put(m, "ipvs", ipvs, len(ipvs) > 0)
	ct := kc.Conntrack
	m["conntrack"] = map[string]any{"maxPerCore": ct.MaxPerCore, "min": ct.Min, "tcpEstablishedTimeout": ct.TCPEstablishedTimeout.Duration.String(),
		"tcpCloseWaitTimeout": ct.TCPCloseWaitTimeout.Duration.String(), "tcpBeLiberal": ct.TCPBeLiberal,
		"udpTimeout": ct.UDPTimeout.Duration.String(), "udpStreamTimeout": ct.UDPStreamTimeout.Duration.String()}
	return m
}
