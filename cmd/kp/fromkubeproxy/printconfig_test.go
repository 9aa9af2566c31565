package fromkubeproxy

import (
	"flag"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/kpproxy/kp/cmd/kp/options"
	"github.com/kpproxy/kp/conntrack"
	"github.com/kpproxy/kp/proxy"
)

// printConfig writes kp's ConfigMap for target and reads it back as kp
// would: the ConfigMap strictly, its config.conf through kp's decoder and
// merge, its kubeconfig's server.
func printConfig(t *testing.T, c *testCluster, to string) (options.Settings, *v1.ConfigMap, string) {
	t.Helper()
	cl := c.read()
	target, err := proxy.ParseTarget(to)
	if err != nil {
		t.Fatal(err)
	}
	g, err := Generate(cl, target)
	if err != nil {
		t.Fatal(err)
	}
	text, err := g.ConfigMap()
	if err != nil {
		t.Fatal(err)
	}
	var cm v1.ConfigMap
	if err := yaml.UnmarshalStrict([]byte(text), &cm); err != nil {
		t.Fatalf("the ConfigMap does not decode: %v\n%s", err, text)
	}
	kc, lenient, err := options.DecodeKubeProxyConfiguration([]byte(cm.Data["config.conf"]), "config.conf")
	if len(lenient) > 0 {
		t.Errorf("the printed configuration decodes only leniently: %v", lenient)
	}
	if err != nil {
		t.Fatalf("kp's decoder refuses config.conf: %v\n%s", err, text)
	}
	s, err := options.SettingsFromConfig(kc, nil, "config.conf", target)
	if err != nil {
		t.Fatalf("kp refuses config.conf: %v\n%s", err, text)
	}
	if kc.ClientConnection.Kubeconfig != "/var/lib/kp/kubeconfig.conf" {
		t.Errorf("clientConnection.kubeconfig %q, want manifests' /var/lib/kp/kubeconfig.conf", kc.ClientConnection.Kubeconfig)
	}
	kcfg, err := clientcmd.Load([]byte(cm.Data["kubeconfig.conf"]))
	if err != nil {
		t.Fatalf("kubeconfig.conf: %v\n%s", err, text)
	}
	server := kcfg.Clusters[kcfg.Contexts[kcfg.CurrentContext].Cluster].Server
	t.Logf("%s", text)
	return s, &cm, server
}

const everything = `mode: ipvs
clusterCIDR: 10.244.0.0/16,fd00:244::/56
nodePortAddresses: [10.0.0.0/8]
iptables: {masqueradeAll: true, masqueradeBit: 15, localhostNodePorts: false}
ipvs: {scheduler: lc, strictARP: true, syncPeriod: 20s, minSyncPeriod: 2s, tcpTimeout: 10m, excludeCIDRs: [192.168.0.0/16]}
conntrack: {maxPerCore: 0, tcpCloseWaitTimeout: 30m, udpTimeout: 45s, tcpBeLiberal: true}
metricsBindAddress: 0.0.0.0:10249
oomScoreAdj: -999
featureGates: {AllowServiceExternalIPs: false}
`

// Every value kp acts on comes through, in the target mode's reading too:
// kp reads the section of the mode it runs.
func TestPrintConfigCarriesKubeProxysValuesThroughKPsOwnDecoder(t *testing.T) {
	for _, to := range []string{"ipvs", "nftables", "iptables"} {
		t.Run(to, func(t *testing.T) {
			c := newTestCluster(t, node("node-1", "10.0.0.1", "10.244.0.0/24")).kubeadm(everything)
			s, cm, server := printConfig(t, c, to)
			cfg := s.Config
			want := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/56")}
			if cm.Name != "kp" || cm.Namespace != "kube-system" || server != kubeProxyServer {
				t.Errorf("ConfigMap %s/%s, server %q", cm.Namespace, cm.Name, server)
			}
			if string(cfg.Mode) != to || !slices.Equal(cfg.ClusterCIDRs, want) || !slices.Equal(cfg.NodePortAddresses, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}) {
				t.Errorf("mode %s, clusterCIDRs %v, nodePortAddresses %v", cfg.Mode, cfg.ClusterCIDRs, cfg.NodePortAddresses)
			}
			if !cfg.MasqueradeAll || cfg.MasqueradeBit != 15 || cfg.LocalhostNodePorts || cfg.SyncPeriod != 20*time.Second || cfg.MinSyncPeriod != 2*time.Second {
				t.Errorf("masqueradeAll %v bit %d localhost %v sync %v/%v", cfg.MasqueradeAll, cfg.MasqueradeBit, cfg.LocalhostNodePorts, cfg.SyncPeriod, cfg.MinSyncPeriod)
			}
			if v := cfg.IPVS; v.Scheduler != "lc" || !v.StrictARP || v.TCPTimeout != 10*time.Minute || len(v.ExcludeCIDRs) != 1 {
				t.Errorf("ipvs %+v", v)
			}
			wantCT := conntrack.Tuning{MaxPerCore: 0, Min: 131072, TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: 30 * time.Minute,
				TCPBeLiberal: true, UDPTimeout: 45 * time.Second}
			if s.Conntrack != wantCT {
				t.Errorf("conntrack %+v, want %+v", s.Conntrack, wantCT)
			}
			if cfg.MetricsBindAddress != "0.0.0.0:10249" || cfg.HealthzBindAddress != "0.0.0.0:10256" {
				t.Errorf("metrics %q healthz %q", cfg.MetricsBindAddress, cfg.HealthzBindAddress)
			}
			if !cfg.IgnoreExternalIPs {
				t.Errorf("AllowServiceExternalIPs=false not carried: externalIPs still proxied")
			}
			for _, note := range []string{"# oomScoreAdj left out"} {
				if !strings.Contains(cm.Data["config.conf"], note) {
					t.Errorf("config.conf does not note %q", note)
				}
			}
		})
	}
}

// Without a clusterCIDR in kube-proxy's configuration, kubeadm's pod subnet
// fills it in, and says so.
func TestPrintConfigTakesClusterCIDRFromKubeadm(t *testing.T) {
	c := newTestCluster(t, node("node-1", "10.0.0.1", "10.244.0.0/24")).kubeadm("mode: iptables\n")
	cm := configMap("kubeadm-config", map[string]string{"ClusterConfiguration": "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\nnetworking:\n  podSubnet: 10.32.0.0/12\n"})
	c.create(cm)
	s, out, _ := printConfig(t, c, "nftables")
	if !slices.Equal(s.Config.ClusterCIDRs, []netip.Prefix{netip.MustParsePrefix("10.32.0.0/12")}) ||
		!strings.Contains(out.Data["config.conf"], "# clusterCIDR from kubeadm-config's networking.podSubnet.") {
		t.Errorf("clusterCIDRs %v\n%s", s.Config.ClusterCIDRs, out.Data["config.conf"])
	}
}

// A kube-proxy run by flags alone: they carry over the same way.
func TestPrintConfigFromAFlagsOnlyKubeProxy(t *testing.T) {
	c := newTestCluster(t, node("node-1", "10.0.0.1", "10.244.0.0/24"))
	c.create(configMap("kube-proxy", map[string]string{"kubeconfig.conf": kubeconfigFor(kubeProxyServer)}))
	c.create(daemonSet("kube-proxy", []string{"/usr/local/bin/kube-proxy", "--proxy-mode=iptables", "--kubeconfig=/var/lib/kube-proxy/kubeconfig.conf",
		"--cluster-cidr=10.244.0.0/16", "--conntrack-max-per-core=0", "--masquerade-all"},
		v1.VolumeMount{Name: "kube-proxy", MountPath: "/var/lib/kube-proxy"}, configMapVolume("kube-proxy", "kube-proxy")))
	s, _, server := printConfig(t, c, "nftables")
	if !slices.Equal(s.Config.ClusterCIDRs, []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}) || s.Conntrack.MaxPerCore != 0 ||
		!s.Config.MasqueradeAll || server != kubeProxyServer {
		t.Errorf("clusterCIDRs %v maxPerCore %d masqueradeAll %v server %q", s.Config.ClusterCIDRs, s.Conntrack.MaxPerCore, s.Config.MasqueradeAll, server)
	}
}

// kube-proxy in-cluster (no kubeconfig): the API server's address is the
// one the command reached it at, and the file says so.
func TestPrintConfigFallsBackToTheCommandsAPIServer(t *testing.T) {
	c := newTestCluster(t, node("node-1", "10.0.0.1", "10.244.0.0/24"))
	c.create(configMap("kube-proxy", map[string]string{"config.conf": header + "mode: iptables\n"}))
	c.create(daemonSet("kube-proxy", []string{"kube-proxy", "--config=/var/lib/kube-proxy/config.conf"},
		v1.VolumeMount{Name: "kube-proxy", MountPath: "/var/lib/kube-proxy"}, configMapVolume("kube-proxy", "kube-proxy")))
	_, cm, server := printConfig(t, c, "nftables")
	if server != "https://api.example:6443" || !strings.Contains(cm.Data["kubeconfig.conf"], "the address this command reached the API server at") {
		t.Errorf("server %q\n%s", server, cm.Data["kubeconfig.conf"])
	}
}

// kube-proxy's detectLocalMode and its interface come through to kp's
// ConfigMap (kp has every mode), from a file or from flags; a mode
// kube-proxy itself refuses is left out, and the file says so.
func TestPrintConfigCarriesDetectLocalMode(t *testing.T) {
	for _, tc := range []struct {
		name, config string
		flags        []string // a flags-only kube-proxy, instead of config
		want         proxy.DetectLocal
		note         string
	}{
		{name: "unset", config: "mode: iptables\n", want: proxy.DetectLocal{}},
		{name: "ClusterCIDR", config: "detectLocalMode: ClusterCIDR\n", want: proxy.DetectLocal{Mode: proxy.LocalModeClusterCIDR}},
		{name: "NodeCIDR", config: "detectLocalMode: NodeCIDR\n", want: proxy.DetectLocal{Mode: proxy.LocalModeNodeCIDR}},
		{name: "BridgeInterface", config: "detectLocalMode: BridgeInterface\ndetectLocal: {bridgeInterface: cbr0}\n",
			want: proxy.DetectLocal{Mode: proxy.LocalModeBridgeInterface, BridgeInterface: "cbr0"}},
		{name: "InterfaceNamePrefix, and a bridge it does not read", config: "detectLocalMode: InterfaceNamePrefix\ndetectLocal: {interfaceNamePrefix: veth, bridgeInterface: cbr0}\n",
			want: proxy.DetectLocal{Mode: proxy.LocalModeInterfaceNamePrefix, InterfaceNamePrefix: "veth", BridgeInterface: "cbr0"}},
		{name: "InterfaceNamePrefix from flags", flags: []string{"--detect-local-mode=InterfaceNamePrefix", "--pod-interface-name-prefix=cali"},
			want: proxy.DetectLocal{Mode: proxy.LocalModeInterfaceNamePrefix, InterfaceNamePrefix: "cali"}},
		{name: "BridgeInterface without its bridge", config: "detectLocalMode: BridgeInterface\n",
			note: "# detectLocalMode BridgeInterface left out: detectLocal.bridgeInterface is empty (kube-proxy refuses that too)"},
		{name: "not a mode", config: "detectLocalMode: PodCIDR\n", note: "# detectLocalMode PodCIDR left out: not a detect-local mode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newTestCluster(t, node("node-1", "10.0.0.1", "10.244.0.0/24"))
			if tc.flags != nil {
				c.create(configMap("kube-proxy", map[string]string{"kubeconfig.conf": kubeconfigFor(kubeProxyServer)}))
				c.create(daemonSet("kube-proxy", append([]string{"kube-proxy", "--kubeconfig=/var/lib/kube-proxy/kubeconfig.conf"}, tc.flags...),
					v1.VolumeMount{Name: "kube-proxy", MountPath: "/var/lib/kube-proxy"}, configMapVolume("kube-proxy", "kube-proxy")))
			} else {
				c.kubeadm(tc.config)
			}
			s, cm, _ := printConfig(t, c, "nftables")
			if got := s.Config.DetectLocal; !reflect.DeepEqual(got, tc.want) {
				t.Errorf("detect-local %+v, want %+v", got, tc.want)
			}
			conf := cm.Data["config.conf"]
			if tc.note != "" && !strings.Contains(conf, tc.note) {
				t.Errorf("config.conf does not note %q", tc.note)
			}
			if tc.note == "" && strings.Contains(conf, "detectLocalMode") != (tc.want.Mode != "") {
				t.Errorf("config.conf names detectLocalMode: %v, want %v", !(tc.want.Mode != ""), tc.want.Mode != "")
			}
		})
	}
}

// updateChartExample rewrites test/helm/testdata/print-config.yaml.
var updateChartExample = flag.Bool("update-chart-example", false, "rewrite test/helm/testdata/print-config.yaml from --print-config's output")

// chartExample is --print-config's output for a kubeadm cluster, kept
// where the chart's tests read it: the chart's fromKubeProxy value takes
// this output whole (test/helm, TestWholeFilesReplaceWhatTheValuesWrite),
// so a change of what --print-config prints fails here first, with the
// file to refresh.
const chartExample = "../../../test/helm/testdata/print-config.yaml"

func TestPrintConfigOutputIsTheChartsExample(t *testing.T) {
	c := newTestCluster(t, node("node-1", "10.0.0.1", "10.244.0.0/24")).kubeadm("mode: iptables\nclusterCIDR: 10.244.0.0/16\noomScoreAdj: -999\n")
	g, err := Generate(c.read(), proxy.Target{Mode: proxy.ModeNFTables})
	if err != nil {
		t.Fatal(err)
	}
	got, err := g.ConfigMap()
	if err != nil {
		t.Fatal(err)
	}
	if *updateChartExample {
		if err := os.WriteFile(chartExample, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(chartExample)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("--print-config prints, for kubeadm's kube-proxy:\n%s\n%s holds:\n%s\nRefresh it (go test -run %s ./cmd/kp/fromkubeproxy/ -args -update-chart-example) "+
			"and run test/helm's tests: the chart's fromKubeProxy takes this output", got, chartExample, want, t.Name())
	}
}
