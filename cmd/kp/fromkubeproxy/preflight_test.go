package fromkubeproxy

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/kpproxy/kp/proxy"
)

// preflightOf reads the cluster and runs the preflight for to ("" : the
// default target).
func preflightOf(t *testing.T, c *testCluster, to string) *Report {
	t.Helper()
	cl := c.read()
	target, from, err := Target(to, cl)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Preflight(cl, target, from)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// item finds id among the cluster's items or node's.
func (r *Report) item(t *testing.T, node, id string) Item {
	t.Helper()
	items := r.Cluster
	if node != "" {
		i := slices.IndexFunc(r.Nodes, func(n NodeReport) bool { return n.Node == node })
		if i < 0 {
			t.Fatalf("no node %s in the report", node)
		}
		items = r.Nodes[i].Items
	}
	for _, it := range items {
		if it.ID == id {
			return it
		}
	}
	t.Fatalf("no item %s (node %q) in the report", id, node)
	return Item{}
}

// Each item against a kube-proxy configuration that sets what it is about:
// what kube-proxy does, what kp in the target mode will do, the severity.
func TestPreflightItemsAgainstKubeProxysConfigMap(t *testing.T) {
	for _, tc := range []struct {
		name, config, to string
		kpConfigMap      bool // kp's ConfigMap exists, as manifests/ has it
		node, id         string
		severity         Severity
		kubeProxy, kp    string // substrings of the item's texts
		action           string
	}{
		{"iptables to nftables: localhost NodePorts go", "mode: iptables\n", "nftables", false, "node-1", "localhost-nodeports", SeverityWarning,
			"127.0.0.1 too", "nftables cannot DNAT loopback", "dial the node's IP"},
		{"localhostNodePorts off: nothing changes", "mode: iptables\niptables: {localhostNodePorts: false}\n", "nftables", false, "node-1", "localhost-nodeports", SeverityOK,
			"does not answer", "does not answer", ""},
		{"iptables to iptables: localhost NodePorts stay", "mode: iptables\n", "iptables", false, "node-1", "localhost-nodeports", SeverityOK,
			"127.0.0.1 too", "127.0.0.1 too", ""},
		{"iptables to nftables: NodePorts only on the Node's addresses", "mode: iptables\n", "nftables", false, "node-1", "nodeport-addresses", SeverityWarning,
			"every other local address (the iptables mode's default)", "10.0.0.1 (the nftables mode's default: the node's primary IPs)", `"0.0.0.0/0", "::/0"`},
		{"nodePortAddresses carried: the same", "mode: iptables\nnodePortAddresses: [10.0.0.0/8]\n", "nftables", false, "node-1", "nodeport-addresses", SeverityOK,
			"other local addresses in [10.0.0.0/8]", "other local addresses in [10.0.0.0/8]", ""},
		{"nftables to iptables: more addresses", "mode: nftables\n", "iptables", false, "node-1", "nodeport-addresses", SeverityInfo,
			"the node's primary IPs", "every other local address", ""},
		{"ipvs lc to nftables: no equivalent", "mode: ipvs\nipvs: {scheduler: lc}\n", "nftables", false, "", "ipvs-scheduler", SeverityWarning,
			"IPVS scheduler lc", "numgen random", "no equivalent of lc"},
		{"ipvs sh to iptables: session affinity", "mode: ipvs\nipvs: {scheduler: sh}\n", "iptables", false, "", "ipvs-scheduler", SeverityWarning,
			"IPVS scheduler sh", "statistic random", "sessionAffinity: ClientIP"},
		{"ipvs rr to nftables", "mode: ipvs\n", "nftables", false, "", "ipvs-scheduler", SeverityInfo, "IPVS scheduler rr", "random", ""},
		{"ipvs lc to ipvs: kept", "mode: ipvs\nipvs: {scheduler: lc}\n", "ipvs", false, "", "ipvs-scheduler", SeverityOK, "IPVS scheduler lc", "IPVS scheduler lc", ""},
		{"strictARP, ipvs to nftables", "mode: ipvs\nipvs: {strictARP: true}\n", "nftables", false, "", "strict-arp", SeverityInfo,
			"arp_ignore=1", "stay until the node reboots", ""},
		{"strictARP, ipvs to ipvs: kept", "mode: ipvs\nipvs: {strictARP: true}\n", "ipvs", false, "", "strict-arp", SeverityOK, "arp_ignore=1", "arp_ignore=1", ""},
		{"iptables to ipvs without strictARP: MetalLB", "mode: iptables\n", "ipvs", false, "", "strict-arp", SeverityWarning,
			"no ARP sysctl", "answers ARP", "MetalLB"},
		{"masqueradeAll carried into the generated config", "mode: iptables\niptables: {masqueradeAll: true}\n", "nftables", false, "", "masquerade-all", SeverityOK,
			"all traffic to Service addresses (iptables.masqueradeAll true", "all traffic", ""},
		{"masqueradeAll lost in kp's own ConfigMap", "mode: iptables\niptables: {masqueradeAll: true}\n", "nftables", true, "", "masquerade-all", SeverityWarning,
			"all traffic", "only what needs it", "masqueradeAll: true"},
		{"masqueradeAll in the section of another mode does nothing", "mode: nftables\niptables: {masqueradeAll: true}\n", "nftables", false, "", "masquerade-all", SeverityOK,
			"only what needs it: to ClusterIPs from outside clusterCIDR, to external addresses (nftables.masqueradeAll false", "only what needs it", ""},
		{"clusterCIDR empty: generated from the nodes' podCIDRs", "mode: iptables\n", "nftables", false, "node-2", "cluster-cidr", SeverityInfo,
			"pods are none", "10.244.0.0/23", ""},
		{"clusterCIDR lost in kp's own ConfigMap", "mode: iptables\nclusterCIDR: 10.244.0.0/16\n", "nftables", true, "node-1", "cluster-cidr", SeverityWarning,
			"10.244.0.0/16", "cannot tell pods", "clusterCIDR: 10.244.0.0/16"},
		{"clusterCIDR empty on both", "mode: iptables\n", "nftables", true, "node-1", "cluster-cidr", SeverityInfo,
			"pods are none", "cannot tell pods", "set clusterCIDR: 10.244.0.0/23"},
		{"a node's pods outside clusterCIDR", "mode: iptables\nclusterCIDR: 10.244.0.0/24\n", "nftables", false, "node-2", "cluster-cidr", SeverityWarning,
			"10.244.0.0/24", "this node's pods (10.244.1.0/24) are outside it", "set clusterCIDR"},
		{"clusterCIDR carried", "mode: iptables\nclusterCIDR: 10.244.0.0/16\n", "nftables", false, "node-2", "cluster-cidr", SeverityOK,
			"10.244.0.0/16", "10.244.0.0/16", ""},
		{"conntrack carried", "mode: iptables\nconntrack: {maxPerCore: 0, tcpEstablishedTimeout: 2h}\n", "nftables", false, "node-1", "conntrack", SeverityOK,
			"no nf_conntrack_max (left as is), tcp_timeout_established 7200s", "no nf_conntrack_max (left as is), tcp_timeout_established 7200s", ""},
		{"conntrack of kp's own ConfigMap differs", "mode: iptables\nconntrack: {maxPerCore: 0}\n", "nftables", true, "node-1", "conntrack", SeverityWarning,
			"no nf_conntrack_max", "nf_conntrack_max 131072 (32768 per CPU × 2, at least 131072)", "kube-proxy's conntrack section"},
		{"detectLocalMode unset on both: clusterCIDR", "mode: iptables\n", "nftables", true, "", "detect-local-mode", SeverityOK,
			"clusterCIDR (detectLocalMode ClusterCIDR)", "clusterCIDR (detectLocalMode ClusterCIDR)", ""},
		{"detectLocalMode NodeCIDR carried into the generated config", "mode: iptables\ndetectLocalMode: NodeCIDR\n", "nftables", false, "", "detect-local-mode", SeverityOK,
			"the node's podCIDRs (detectLocalMode NodeCIDR)", "the node's podCIDRs (detectLocalMode NodeCIDR)", ""},
		{"detectLocalMode NodeCIDR lost in kp's own ConfigMap", "mode: iptables\ndetectLocalMode: NodeCIDR\n", "nftables", true, "", "detect-local-mode", SeverityWarning,
			"the node's podCIDRs (detectLocalMode NodeCIDR)", "clusterCIDR (detectLocalMode ClusterCIDR)", "set detectLocalMode: NodeCIDR in kp's configuration"},
		{"detectLocalMode BridgeInterface carried with its bridge", "mode: ipvs\ndetectLocalMode: BridgeInterface\ndetectLocal: {bridgeInterface: cbr0}\n", "ipvs", false, "",
			"detect-local-mode", SeverityOK, "the bridge it comes in on, cbr0 (detectLocalMode BridgeInterface)", "the bridge it comes in on, cbr0", ""},
		{"detectLocalMode NodeCIDR carried: the node's podCIDRs, not clusterCIDR", "mode: iptables\ndetectLocalMode: NodeCIDR\n", "nftables", false, "node-2", "cluster-cidr", SeverityOK,
			"this node's podCIDRs, 10.244.1.0/24", "this node's podCIDRs, 10.244.1.0/24 (detectLocalMode NodeCIDR), not clusterCIDR", ""},
		{"an interface mode carried: a clusterCIDR that misses the node does not matter",
			"mode: iptables\nclusterCIDR: 10.244.0.0/24\ndetectLocalMode: InterfaceNamePrefix\ndetectLocal: {interfaceNamePrefix: veth}\n", "nftables", false, "node-2",
			"cluster-cidr", SeverityOK, "what comes in on their interfaces", "named veth* (detectLocalMode InterfaceNamePrefix), not by clusterCIDR", ""},
		{"feature gates left out of the generated config", "mode: iptables\nfeatureGates: {SomeGate: true}\n", "nftables", false, "", "config", SeverityInfo,
			"reads ConfigMap kube-system/kube-proxy, key config.conf", "featureGates SomeGate=true left out: kube-proxy v1.36 refuses these gates too", "--print-config"},
		{"kp's own ConfigMap with manifests' placeholder server", "mode: iptables\n", "nftables", true, "", "api-server", SeverityError,
			kubeProxyServer, "CONTROL-PLANE-ENDPOINT", "replace manifests/configmap.yaml's placeholder"},
		{"the generated config reaches kube-proxy's API server", "mode: iptables\n", "nftables", false, "", "api-server", SeverityOK,
			kubeProxyServer, kubeProxyServer, ""},
		{"mode", "mode: iptables\n", "nftables", false, "", "mode", SeverityInfo, "iptables mode", "nftables mode", ""},
		{"mode kept", "bindAddress: 0.0.0.0\n", "iptables-nft", false, "", "mode", SeverityOK, "iptables mode", "iptables-nft mode", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newTestCluster(t, node("node-1", "10.0.0.1", "10.244.0.0/24"), node("node-2", "10.0.0.2", "10.244.1.0/24")).kubeadm(tc.config)
			if tc.kpConfigMap {
				c.manifestsKP()
			}
			it := preflightOf(t, c, tc.to).item(t, tc.node, tc.id)
			wantItem(t, it, tc.severity, tc.kubeProxy, tc.kp, tc.action)
		})
	}
}

// wantItem checks an item's severity and that its texts hold the substrings.
func wantItem(t *testing.T, it Item, severity Severity, kubeProxy, kp, action string) {
	t.Helper()
	if it.Severity != severity || !strings.Contains(it.KubeProxy, kubeProxy) || !strings.Contains(it.KP, kp) || !strings.Contains(it.Action, action) {
		t.Errorf("got %s\n  kube-proxy: %s\n  kp:         %s\n  do:         %s\nwant %s, kube-proxy %q, kp %q, do %q",
			it.Severity, it.KubeProxy, it.KP, it.Action, severity, kubeProxy, kp, action)
	}
}

// kp's own ConfigMap says how kp tells pods' traffic: the detect-local-mode
// item compares it with kube-proxy's, interface included, and the
// cluster-cidr item asks clusterCIDR only in ClusterCIDR mode.
func TestPreflightFollowsKPsDetectLocalMode(t *testing.T) {
	for _, tc := range []struct {
		name, kubeProxyConfig, kpConfig, to, node, id string
		severity                                      Severity
		kubeProxy, kp, action                         string
	}{
		{name: "kp by an interface prefix, kube-proxy by clusterCIDR", kubeProxyConfig: "mode: iptables\nclusterCIDR: 10.244.0.0/16\n",
			kpConfig: "detectLocalMode: InterfaceNamePrefix\ndetectLocal: {interfaceNamePrefix: veth}\n", to: "nftables", id: "detect-local-mode",
			severity: SeverityWarning, kubeProxy: "clusterCIDR (detectLocalMode ClusterCIDR)", kp: "named veth* (detectLocalMode InterfaceNamePrefix)",
			action: "set detectLocalMode: ClusterCIDR in kp's configuration"},
		{name: "the same mode, another bridge", kubeProxyConfig: "mode: iptables\ndetectLocalMode: BridgeInterface\ndetectLocal: {bridgeInterface: cbr0}\n",
			kpConfig: "detectLocalMode: BridgeInterface\ndetectLocal: {bridgeInterface: br0}\n", to: "iptables", id: "detect-local-mode",
			severity: SeverityWarning, kubeProxy: "cbr0", kp: "br0", action: "detectLocalMode: BridgeInterface and detectLocal.bridgeInterface: cbr0"},
		{name: "the same bridge", kubeProxyConfig: "mode: iptables\ndetectLocalMode: BridgeInterface\ndetectLocal: {bridgeInterface: cbr0}\n",
			kpConfig: "detectLocalMode: BridgeInterface\ndetectLocal: {bridgeInterface: cbr0}\n", to: "iptables", id: "detect-local-mode",
			severity: SeverityOK, kubeProxy: "cbr0", kp: "cbr0"},
		{name: "userspace tells an interface by the client's route", kubeProxyConfig: "mode: iptables\ndetectLocalMode: InterfaceNamePrefix\ndetectLocal: {interfaceNamePrefix: cali}\n",
			kpConfig: "detectLocalMode: InterfaceNamePrefix\ndetectLocal: {interfaceNamePrefix: cali}\n", to: "userspace", id: "detect-local-mode",
			severity: SeverityOK, kubeProxy: "cali*", kp: "the interface the node routes the client through"},
		{name: "no clusterCIDR is fine by an interface", kubeProxyConfig: "mode: iptables\n",
			kpConfig: "detectLocalMode: BridgeInterface\ndetectLocal: {bridgeInterface: cbr0}\n", to: "nftables", node: "node-1", id: "cluster-cidr",
			severity: SeverityOK, kubeProxy: "pods are none (clusterCIDR)", kp: "the bridge it comes in on, cbr0 (detectLocalMode BridgeInterface), not by clusterCIDR"},
		{name: "no clusterCIDR is a warning by clusterCIDR", kubeProxyConfig: "mode: iptables\nclusterCIDR: 10.244.0.0/16\n",
			kpConfig: "detectLocalMode: ClusterCIDR\n", to: "nftables", node: "node-1", id: "cluster-cidr",
			severity: SeverityWarning, kubeProxy: "10.244.0.0/16", kp: "cannot tell pods", action: "set clusterCIDR: 10.244.0.0/16"},
		{name: "NodeCIDR on a node with podCIDRs", kubeProxyConfig: "mode: iptables\nclusterCIDR: 10.244.0.0/16\n",
			kpConfig: "detectLocalMode: NodeCIDR\n", to: "nftables", node: "node-1", id: "cluster-cidr",
			severity: SeverityOK, kubeProxy: "10.244.0.0/16", kp: "this node's podCIDRs, 10.244.0.0/24 (detectLocalMode NodeCIDR), not clusterCIDR"},
		{name: "NodeCIDR on a node without podCIDRs: kp would not start", kubeProxyConfig: "mode: iptables\nclusterCIDR: 10.244.0.0/16\n",
			kpConfig: "detectLocalMode: NodeCIDR\n", to: "nftables", node: "node-3", id: "cluster-cidr",
			severity: SeverityError, kubeProxy: "10.244.0.0/16", kp: "exits without them after 5 minutes", action: "--allocate-node-cidrs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newTestCluster(t, node("node-1", "10.0.0.1", "10.244.0.0/24"), node("node-3", "10.0.0.3", "")).kubeadm(tc.kubeProxyConfig)
			c.create(configMap("kp", map[string]string{"config.conf": header + tc.kpConfig}))
			r := preflightOf(t, c, tc.to)
			if cfg := r.item(t, "", "config"); cfg.Severity == SeverityError {
				t.Fatalf("kp refuses its ConfigMap: %s", cfg.KP)
			}
			wantItem(t, r.item(t, tc.node, tc.id), tc.severity, tc.kubeProxy, tc.kp, tc.action)
		})
	}
}

// A configuration kp refuses is an error: kp would not start.
func TestPreflightReportsAKPConfigMapKPRefuses(t *testing.T) {
	c := newTestCluster(t, node("node-1", "10.0.0.1", "10.244.0.0/24")).kubeadm("mode: iptables\n")
	c.create(configMap("kp", map[string]string{"config.conf": header + "detectLocalMode: BridgeInterface\n"}))
	r := preflightOf(t, c, "")
	it := r.item(t, "", "config")
	if it.Severity != SeverityError || !strings.Contains(it.KP, "would not start") || !strings.Contains(it.KP, "detectLocalMode") {
		t.Errorf("got %+v", it)
	}
	if r.Summary.Error == 0 {
		t.Errorf("summary %+v counts no error", r.Summary)
	}
}

func TestTargetIsToThenKPsConfigMapThenNFTables(t *testing.T) {
	c := newTestCluster(t).kubeadm("mode: iptables\n")
	if tg, from, _ := Target("", c.read()); tg.Mode != proxy.ModeNFTables || !strings.Contains(from, "kp's default") {
		t.Errorf("no kp ConfigMap: %v from %q", tg, from)
	}
	c.create(configMap("kp", map[string]string{"config.conf": header + "mode: ipvs\n"}))
	if tg, from, _ := Target("", c.read()); tg.Mode != proxy.ModeIPVS || !strings.Contains(from, "ConfigMap kube-system/kp") {
		t.Errorf("kp's ConfigMap says ipvs: %v from %q", tg, from)
	}
	if tg, from, _ := Target("iptables-legacy", c.read()); tg.String() != "iptables-legacy" || from != "--to" {
		t.Errorf("--to iptables-legacy: %v from %q", tg, from)
	}
}

// The JSON form's field names are what scripts read: they stay.
func TestPreflightJSONKeepsItsFieldNames(t *testing.T) {
	c := newTestCluster(t, node("node-1", "10.0.0.1", "10.244.0.0/24"), node("node-2", "10.0.0.2", "10.244.1.0/24")).kubeadm("mode: iptables\n")
	r := preflightOf(t, c, "")
	var buf bytes.Buffer
	if err := r.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		KubeProxy map[string]any   `json:"kubeProxy"`
		KP        map[string]any   `json:"kp"`
		Cluster   []map[string]any `json:"cluster"`
		Nodes     []map[string]any `json:"nodes"`
		Summary   map[string]int   `json:"summary"`
	}
	dec := json.NewDecoder(&buf)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("%v\n%s", err, buf.String())
	}
	keys := func(m map[string]any) []string {
		var out []string
		for k := range m {
			out = append(out, k)
		}
		slices.Sort(out)
		return out
	}
	if got := keys(doc.KubeProxy); !slices.Equal(got, []string{"config", "mode"}) || doc.KubeProxy["mode"] != "iptables" {
		t.Errorf("kubeProxy: %v", doc.KubeProxy)
	}
	if got := keys(doc.KP); !slices.Equal(got, []string{"config", "generated", "mode", "modeFrom"}) || doc.KP["generated"] != true {
		t.Errorf("kp: %v", doc.KP)
	}
	if len(doc.Nodes) != 2 || doc.Nodes[0]["node"] != "node-1" || doc.Nodes[1]["node"] != "node-2" {
		t.Fatalf("nodes: %v", doc.Nodes)
	}
	if got := keys(doc.Nodes[0]); !slices.Equal(got, []string{"addresses", "cpus", "items", "node", "podCIDRs"}) {
		t.Errorf("a node's fields: %v", got)
	}
	var ids []string
	for _, it := range doc.Nodes[0]["items"].([]any) {
		m := it.(map[string]any)
		if got := keys(m); !slices.Equal(got, []string{"action", "id", "kp", "kubeProxy", "severity"}) &&
			!slices.Equal(got, []string{"id", "kp", "kubeProxy", "severity"}) {
			t.Errorf("an item's fields: %v", got)
		}
		ids = append(ids, m["id"].(string))
	}
	if !slices.Equal(ids, []string{"localhost-nodeports", "nodeport-addresses", "cluster-cidr", "conntrack"}) {
		t.Errorf("a node's items: %v", ids)
	}
	ids = nil
	for _, it := range doc.Cluster {
		ids = append(ids, it["id"].(string))
	}
	if !slices.Equal(ids, []string{"mode", "config", "api-server", "masquerade-all", "ipvs-scheduler", "strict-arp", "detect-local-mode"}) {
		t.Errorf("the cluster's items: %v", ids)
	}
	s := doc.Summary
	if s["ok"]+s["info"]+s["warning"]+s["error"] != len(doc.Cluster)+2*4 || s["warning"] == 0 {
		t.Errorf("summary %v", s)
	}
}

func TestPreflightTextNamesEveryNodeAndItem(t *testing.T) {
	c := newTestCluster(t, node("node-1", "10.0.0.1", "10.244.0.0/24"), node("node-2", "10.0.0.2", "10.244.1.0/24")).kubeadm("mode: iptables\n")
	var buf bytes.Buffer
	preflightOf(t, c, "").WriteText(&buf)
	out := buf.String()
	for _, want := range []string{"kube-proxy: iptables mode, from ConfigMap kube-system/kube-proxy, key config.conf",
		"Node node-1 (InternalIP 10.0.0.1; podCIDRs 10.244.0.0/24; 2 CPUs):", "Node node-2 (InternalIP 10.0.0.2",
		"WARNING  localhost-nodeports", "do:         clients on the node that dial 127.0.0.1", "Preflight: 0 error(s), "} {
		if !strings.Contains(out, want) {
			t.Errorf("the text has no %q:\n%s", want, out)
		}
	}
}
