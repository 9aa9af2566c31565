package options

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/proxy"
)

func decode(t *testing.T, yaml string) *KubeProxyConfiguration {
	t.Helper()
	kc, _, err := DecodeKubeProxyConfiguration([]byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"+yaml), "test")
	if err != nil {
		t.Fatal(err)
	}
	return kc
}

func TestDecodeKubeProxyConfigurationNamesItsSourceAndTheField(t *testing.T) {
	const source = "ConfigMap kube-system/kube-proxy, key config.conf"
	// An unknown field decodes leniently, as kube-proxy decodes it, with a
	// warning naming the source and the field.
	_, lenient, err := DecodeKubeProxyConfiguration([]byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclusterCIRD: 10.0.0.0/8\n"), source)
	if err != nil || len(lenient) != 1 || lenient[0].Name != source || !strings.Contains(lenient[0].Reason, "clusterCIRD") {
		t.Fatalf("got %v, %+v", err, lenient)
	}
	// A value of the wrong type fails leniently too.
	_, _, err = DecodeKubeProxyConfiguration([]byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclusterCIDR: [1]\n"), source)
	if err == nil || !strings.HasPrefix(err.Error(), source+": ") || !strings.Contains(err.Error(), "clusterCIDR") {
		t.Fatalf("got %v", err)
	}
}

// What kp does with a file once it serves a target mode: the target's own
// section and defaults, whether the file fixes a mode or not (a switch
// builds what a kp started in the target mode has).
func TestSettingsFromConfigResolvesTheTargetAsASwitchDoes(t *testing.T) {
	for _, tc := range []struct {
		name, yaml    string
		target        string
		masqueradeAll bool
		primary       bool
	}{
		{"auto to iptables: iptables section, every local address", "iptables: {masqueradeAll: true}\n", "iptables", true, false},
		{"auto to nftables: nftables section, primary IPs", "iptables: {masqueradeAll: true}\n", "nftables", false, true},
		{"nftables fixed, switched to iptables: the iptables section, as a kp started in it", "mode: nftables\niptables: {masqueradeAll: true}\n", "iptables", true, false},
		{"iptables fixed, to iptables-legacy", "mode: iptables\niptables: {masqueradeAll: true}\n", "iptables-legacy", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target, err := proxy.ParseTarget(tc.target)
			if err != nil {
				t.Fatal(err)
			}
			s, err := SettingsFromConfig(decode(t, tc.yaml), nil, "test", target)
			if err != nil {
				t.Fatal(err)
			}
			if s.Config.Mode != target.Mode || s.Config.MasqueradeAll != tc.masqueradeAll || s.Config.NodePortPrimary != tc.primary {
				t.Errorf("mode %s masqueradeAll %v primary %v; want %s %v %v", s.Config.Mode, s.Config.MasqueradeAll, s.Config.NodePortPrimary,
					target.Mode, tc.masqueradeAll, tc.primary)
			}
			if target.IPTablesBackend != "" && s.Config.IPTablesBackend != target.IPTablesBackend {
				t.Errorf("iptables backend %q, want %q", s.Config.IPTablesBackend, target.IPTablesBackend)
			}
		})
	}
}

func TestSettingsFromConfigReportsWhatKPRefuses(t *testing.T) {
	_, err := SettingsFromConfig(decode(t, "detectLocalMode: Bogus\n"), nil, "ConfigMap kube-system/kp", proxy.Target{Mode: proxy.ModeNFTables})
	if err == nil || !strings.Contains(err.Error(), "detectLocalMode") || !strings.Contains(err.Error(), "ConfigMap kube-system/kp") {
		t.Fatalf("got %v", err)
	}
}

func TestParseKubeProxyArgsWithConfigReadsOnlyTheFile(t *testing.T) {
	a, err := ParseKubeProxyArgs([]string{"--config=/var/lib/kube-proxy/config.conf", "--hostname-override=$(NODE_NAME)", "--v", "2", "--cluster-cidr=10.0.0.0/8"})
	if err != nil {
		t.Fatal(err)
	}
	if a.ConfigFile != "/var/lib/kube-proxy/config.conf" || a.Flags != nil || a.HostnameOverride != "$(NODE_NAME)" {
		t.Errorf("got %+v", a)
	}
}

// Without --config, each flag lands in the field upstream binds it to.
func TestParseKubeProxyArgsBindsFlagsAsUpstream(t *testing.T) {
	a, err := ParseKubeProxyArgs([]string{"--proxy-mode=ipvs", "--kubeconfig", "/var/lib/kube-proxy/kubeconfig.conf",
		"--cluster-cidr=10.244.0.0/16", "--nodeport-addresses=10.0.0.0/8,192.168.0.0/16", "--masquerade-all",
		"--iptables-localhost-nodeports=false", "--ipvs-scheduler=lc", "--ipvs-strict-arp", "--conntrack-max-per-core=0",
		"--conntrack-tcp-timeout-established=2h", "--detect-local-mode=NodeCIDR", "--feature-gates=NFTablesProxyMode=true",
		"--logtostderr", "-v=4", "--healthz-port=10266", "--master=https://10.0.0.1:6443"})
	if err != nil {
		t.Fatal(err)
	}
	kc := a.Flags
	switch {
	case kc == nil:
		t.Fatal("no configuration from the flags")
	case kc.Mode != "ipvs" || kc.ClientConnection.Kubeconfig != "/var/lib/kube-proxy/kubeconfig.conf" || kc.ClusterCIDR != "10.244.0.0/16":
		t.Errorf("mode %q kubeconfig %q clusterCIDR %q", kc.Mode, kc.ClientConnection.Kubeconfig, kc.ClusterCIDR)
	case !slices.Equal(kc.NodePortAddresses, []string{"10.0.0.0/8", "192.168.0.0/16"}) || !kc.IPTables.MasqueradeAll || !kc.NFTables.MasqueradeAll:
		t.Errorf("nodePortAddresses %q masqueradeAll %v/%v", kc.NodePortAddresses, kc.IPTables.MasqueradeAll, kc.NFTables.MasqueradeAll)
	case kc.IPTables.LocalhostNodePorts == nil || *kc.IPTables.LocalhostNodePorts || kc.IPVS.Scheduler != "lc" || !kc.IPVS.StrictARP:
		t.Errorf("localhostNodePorts %v scheduler %q strictARP %v", kc.IPTables.LocalhostNodePorts, kc.IPVS.Scheduler, kc.IPVS.StrictARP)
	case kc.Conntrack.MaxPerCore == nil || *kc.Conntrack.MaxPerCore != 0 || kc.Conntrack.Min != nil:
		t.Errorf("conntrack max per core %v min %v; want 0 and unset", kc.Conntrack.MaxPerCore, kc.Conntrack.Min)
	case durationOf(kc.Conntrack.TCPEstablishedTimeout) != 2*time.Hour || kc.Conntrack.TCPCloseWaitTimeout != nil:
		t.Errorf("conntrack timeouts %v %v", kc.Conntrack.TCPEstablishedTimeout, kc.Conntrack.TCPCloseWaitTimeout)
	case kc.DetectLocalMode != "NodeCIDR" || !kc.FeatureGates["NFTablesProxyMode"] || kc.HealthzBindAddress != "":
		t.Errorf("detectLocalMode %q gates %v healthz %q", kc.DetectLocalMode, kc.FeatureGates, kc.HealthzBindAddress)
	case a.Master != "https://10.0.0.1:6443":
		t.Errorf("master %q", a.Master)
	}
	// The flags' configuration resolves through kp's own merge.
	s, err := SettingsFromConfig(&KubeProxyConfiguration{ClusterCIDR: kc.ClusterCIDR, NodePortAddresses: kc.NodePortAddresses}, nil, "flags", proxy.Target{Mode: proxy.ModeIPTables})
	if err != nil {
		t.Fatal(err)
	}
	if want := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}; !slices.Equal(s.Config.ClusterCIDRs, want) {
		t.Errorf("cluster CIDRs %v", s.Config.ClusterCIDRs)
	}
}

// Upstream's Complete without --config: a bind address that is a bare IP
// takes the port flag's port (by default the usual one); one with a port
// keeps it, so a port flag alone changes nothing (upstream's default
// address has its port) but 0, which disables the server.
func TestParseKubeProxyArgsCompletesBindAddressesAsUpstream(t *testing.T) {
	for _, tc := range []struct {
		args            []string
		healthz, metric string
	}{
		{[]string{"--healthz-bind-address=127.0.0.1"}, "127.0.0.1:10256", ""},
		{[]string{"--metrics-bind-address=::"}, "", "[::]:10249"},
		{[]string{"--healthz-bind-address=127.0.0.1", "--healthz-port=10266"}, "127.0.0.1:10266", ""},
		{[]string{"--healthz-bind-address=127.0.0.1:9999", "--healthz-port=10266"}, "127.0.0.1:9999", ""},
		{[]string{"--healthz-port=10266", "--metrics-port=10250"}, "", ""},
	} {
		a, err := ParseKubeProxyArgs(tc.args)
		if err != nil {
			t.Fatal(err)
		}
		if a.Flags.HealthzBindAddress != tc.healthz || a.Flags.MetricsBindAddress != tc.metric {
			t.Errorf("%q: healthz %q metrics %q, want %q %q", tc.args, a.Flags.HealthzBindAddress, a.Flags.MetricsBindAddress, tc.healthz, tc.metric)
		}
		if _, err := SettingsFromConfig(a.Flags, nil, "flags", proxy.Target{Mode: proxy.ModeIPTables}); err != nil {
			t.Errorf("%q: %v", tc.args, err)
		}
	}
}

func TestParseKubeProxyArgsNamesAFlagWithABadValue(t *testing.T) {
	if _, err := ParseKubeProxyArgs([]string{"--conntrack-min=lots"}); err == nil || !strings.Contains(err.Error(), "conntrack-min") {
		t.Fatalf("got %v", err)
	}
}
