package options

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/proxy"
)

// kubeadmConfig is the KubeProxyConfiguration kubeadm writes into the
// kube-proxy ConfigMap: every section present, mostly zero values. It must
// load as kp's defaults plus the few fields that are set.
const kubeadmConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: 10.244.0.0/16
configSyncPeriod: 0s
conntrack:
  maxPerCore: null
  min: null
  tcpBeLiberal: false
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: ""
mode: ""
nftables:
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
nodePortAddresses: null
oomScoreAdj: null
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
`

const header = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"

func TestConfigFileBecomesConfig(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		file string
		args []string
		want func(*proxy.Config)
	}{
		{name: "kubeadm's ConfigMap is kp's defaults plus what it sets", file: kubeadmConfig,
			want: func(c *proxy.Config) {
				c.Kubeconfig = "/var/lib/kube-proxy/kubeconfig.conf"
				c.ClusterCIDRs = prefixes("10.244.0.0/16")
			}},
		{name: "a bind address without a port takes the server's usual one, as upstream's defaulting does (k3s passes 127.0.0.1)",
			file: header + "healthzBindAddress: 127.0.0.1\nmetricsBindAddress: \"::\"\n",
			want: func(c *proxy.Config) { c.HealthzBindAddress, c.MetricsBindAddress = "127.0.0.1:10256", "[::]:10249" }},
		{name: "every field kp honours", file: header + `
mode: nftables
hostnameOverride: Worker-3
clusterCIDR: 10.244.0.0/16,fd00:10:244::/56
nodePortAddresses: [192.168.1.0/24]
nftables: {masqueradeAll: true, masqueradeBit: 3, syncPeriod: 1m, minSyncPeriod: 5s}
configSyncPeriod: 1h
metricsBindAddress: 0.0.0.0:9100
healthzBindAddress: 127.0.0.1:9101
clientConnection: {kubeconfig: /etc/kp.kubeconfig}
featureGates: {APIResponseCompression: true}
`, want: func(c *proxy.Config) {
			c.HostnameOverride = "worker-3"
			c.ClusterCIDRs = prefixes("10.244.0.0/16", "fd00:10:244::/56")
			c.NodePortAddresses, c.NodePortPrimary = prefixes("192.168.1.0/24"), false
			c.MasqueradeAll, c.MasqueradeBit = true, 3
			c.SyncPeriod, c.MinSyncPeriod, c.ConfigSyncPeriod = time.Minute, 5*time.Second, time.Hour
			c.MetricsBindAddress, c.HealthzBindAddress = "0.0.0.0:9100", "127.0.0.1:9101"
			c.Kubeconfig = "/etc/kp.kubeconfig"
		}},
		{name: "beside the file, flags with a field in it are ignored, as upstream ignores them", file: header + `
clusterCIDR: 10.244.0.0/16
hostnameOverride: from-file
nftables: {syncPeriod: 10s, masqueradeBit: 3}
`, args: []string{"--cluster-cidr", "10.100.0.0/16", "--iptables-masquerade-bit", "7", "--kubeconfig", "/flag.kubeconfig",
			"--feature-gates", "AllowServiceExternalIPs=false", "--healthz-port", "0"},
			want: func(c *proxy.Config) {
				c.ClusterCIDRs = prefixes("10.244.0.0/16")
				c.HostnameOverride = "from-file"
				c.SyncPeriod, c.MasqueradeBit = 10*time.Second, 3
			}},
		{name: "beside the file, --hostname-override, --master and kp's own flags apply", file: header + `
hostnameOverride: from-file
clientConnection: {kubeconfig: /file.kubeconfig}
`, args: []string{"--hostname-override", "From-Flag", "--master", "https://10.0.0.1:6443", "--service-cidrs", "10.96.0.0/12",
			"--iptables-backend", "legacy", "--sync-period", "1m"},
			want: func(c *proxy.Config) {
				c.HostnameOverride, c.Master, c.Kubeconfig = "from-flag", "https://10.0.0.1:6443", "/file.kubeconfig"
				c.ServiceCIDRs, c.IPTablesBackend, c.SyncPeriod = prefixes("10.96.0.0/12"), "legacy", time.Minute
			}},
		{name: "the nftables section applies in nftables mode, not the iptables one", file: header + `
iptables: {masqueradeAll: true, masqueradeBit: 1, syncPeriod: 2m}
`, want: func(*proxy.Config) {}},
		{name: "the iptables section applies in iptables mode", file: header + `
mode: iptables
iptables: {masqueradeAll: true, masqueradeBit: 1, syncPeriod: 2m, localhostNodePorts: false}
nftables: {masqueradeBit: 2}
`, want: func(c *proxy.Config) {
			c.Mode, c.LocalhostNodePorts, c.NodePortPrimary = proxy.ModeIPTables, false, false
			c.MasqueradeAll, c.MasqueradeBit, c.SyncPeriod = true, 1, 2*time.Minute
		}},
		{name: "beside the file, the mode flag is ignored: the file's mode picks the section", file: header + `
mode: ipvs
iptables: {masqueradeBit: 1}
nftables: {masqueradeBit: 2}
`, args: []string{"--proxy-mode", "nftables"}, want: func(c *proxy.Config) {
			c.Mode, c.MasqueradeBit, c.NodePortPrimary = proxy.ModeIPVS, 1, false
		}},
		{name: "local traffic by the node's pod CIDRs", file: header + "detectLocalMode: NodeCIDR\n",
			want: func(c *proxy.Config) { c.DetectLocal.Mode = proxy.LocalModeNodeCIDR }},
		{name: "local traffic by bridge", file: header + "detectLocalMode: BridgeInterface\ndetectLocal: {bridgeInterface: cbr0}\n",
			want: func(c *proxy.Config) {
				c.DetectLocal.Mode, c.DetectLocal.BridgeInterface = proxy.LocalModeBridgeInterface, "cbr0"
			}},
		{name: "local traffic by interface name prefix", file: header + "detectLocalMode: InterfaceNamePrefix\ndetectLocal: {interfaceNamePrefix: veth}\n",
			want: func(c *proxy.Config) {
				c.DetectLocal.Mode, c.DetectLocal.InterfaceNamePrefix = proxy.LocalModeInterfaceNamePrefix, "veth"
			}},
		{name: "AllowServiceExternalIPs=false is honoured", file: header + "featureGates: {AllowServiceExternalIPs: false}\n",
			want: func(c *proxy.Config) { c.IgnoreExternalIPs = true }},
		{name: "settings that only tune the node are accepted", file: header + `
conntrack: {maxPerCore: 32768, min: 131072, tcpEstablishedTimeout: 24h, tcpCloseWaitTimeout: 1h}
oomScoreAdj: -999
clientConnection: {qps: 5, burst: 10, contentType: application/vnd.kubernetes.protobuf}
detectLocalMode: ClusterCIDR
iptables: {localhostNodePorts: true}
ipvs: {syncPeriod: 30s, minSyncPeriod: 0s}
`, want: func(c *proxy.Config) { c.DetectLocal.Mode = proxy.LocalModeClusterCIDR }},
		{name: "profiling", file: header + "enableProfiling: true\n", want: func(c *proxy.Config) { c.Profiling = true }},
		{name: "the ipvs section in ipvs mode", file: header + `
mode: ipvs
iptables: {masqueradeBit: 5}
ipvs: {scheduler: sh, strictARP: true, excludeCIDRs: [10.1.0.0/16], tcpTimeout: 10s, tcpFinTimeout: 5s, udpTimeout: 3s, syncPeriod: 20s, minSyncPeriod: 2s}
`, want: func(c *proxy.Config) {
			c.Mode, c.MasqueradeBit, c.NodePortPrimary = proxy.ModeIPVS, 5, false
			c.SyncPeriod, c.MinSyncPeriod = 20*time.Second, 2*time.Second
			c.IPVS = proxy.IPVSConfig{Scheduler: "sh", StrictARP: true, ExcludeCIDRs: prefixes("10.1.0.0/16"),
				TCPTimeout: 10 * time.Second, TCPFinTimeout: 5 * time.Second, UDPTimeout: 3 * time.Second}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, "kube-proxy.yaml", tt.file)
			got := configOf(t, dir, append([]string{"--config", path}, tt.args...)...)
			want := defaultsFor(dir)
			tt.want(&want)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("config:\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestConfigFileErrors(t *testing.T) {
	tests := []struct {
		name string
		file string
		args []string
		want string // stderr after "kp: --config PATH: "; several lines are joined with "\n--config PATH: "
	}{
		{"an unsupported field names the field", header + "portRange: 30000-32767\n",
			nil, "field portRange is not supported by kp; remove it or leave it empty"},
		{"an unknown IPVS scheduler", header + "ipvs: {scheduler: fancy}\n",
			nil, `ipvs.scheduler "fancy": unknown IPVS scheduler; use one of rr, wrr, lc, wlc, lblc, lblcr, dh, sh, sed, nq, mh, fo, ovf, twos`},
		{"every unsupported field at once", header + "portRange: 30000-32767\nwinkernel: {networkName: l2bridge}\n",
			nil, "field winkernel is not supported by kp; remove it or leave it empty\n" +
				"--config PATH: field portRange is not supported by kp; remove it or leave it empty"},
		{"bridge detection without a bridge", header + "detectLocalMode: BridgeInterface\n",
			nil, `detectLocal.bridgeInterface: Invalid value: "": must not be empty with detectLocalMode BridgeInterface`},
		{"an unknown local traffic detection", header + "detectLocalMode: PodLabel\n",
			nil, `detectLocalMode "PodLabel": Unsupported value: "PodLabel": supported values: "ClusterCIDR", "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix", ""`},
		{"unknown feature gate, as upstream words it", header + "featureGates: {SomeAlphaThing: true, APIResponseCompression: true}\n",
			nil, "featureGates: unrecognized feature gate: SomeAlphaThing"},
		{"a locked feature gate set against its default", header + "featureGates: {PreferSameTrafficDistribution: false}\n",
			nil, "featureGates: cannot set feature gate PreferSameTrafficDistribution to false, feature is locked to true"},
		{"json logs with LoggingBetaOptions off", header + "featureGates: {LoggingBetaOptions: false}\nlogging: {format: json}\n",
			nil, "logging.format: Forbidden: Log format json is disabled, see LoggingBetaOptions feature"},
		{"split streams without LoggingAlphaOptions", header + "logging: {options: {text: {splitStream: true}}}\n",
			nil, "logging.options.text.splitStream: Forbidden: Feature LoggingAlphaOptions is disabled"},
		{"a syntax error fails leniently too", header + "mode: [ipvs\n",
			nil, "yaml: line 3: did not find expected ',' or ']'"},
		{"another API version", "apiVersion: kubeproxy.config.k8s.io/v1alpha2\nkind: KubeProxyConfiguration\n",
			nil, `apiVersion is "kubeproxy.config.k8s.io/v1alpha2"; kp reads kubeproxy.config.k8s.io/v1alpha1`},
		{"another kind", "apiVersion: v1\nkind: ConfigMap\n",
			nil, `kind is "ConfigMap"; want KubeProxyConfiguration`},
		{"an empty file", "",
			nil, `the file is empty; want a KubeProxyConfiguration`},
		{"a value of the wrong type", header + "nftables: {masqueradeBit: high}\n",
			nil, `json: cannot unmarshal string into Go struct field KubeProxyNFTablesConfiguration.nftables.masqueradeBit of type int32`},
		{"an invalid CIDR", header + "clusterCIDR: 10.0.0.0/33\n",
			nil, `clusterCIDR "10.0.0.0/33": invalid CIDR`},
		{"a mark bit out of range", header + "nftables: {masqueradeBit: 40}\n",
			nil, `nftables.masqueradeBit "40": must be within [0, 31]`},
		{"a specific bind address", header + "bindAddress: 10.0.0.5\n",
			nil, `bindAddress "10.0.0.5": kp does not support overriding the node's primary IP; leave it unset, 0.0.0.0 or ::`},
		{"an unknown log format", header + "logging: {format: xml}\n",
			nil, `logging.format "xml": kp logs as text or json`},
		{"an unknown mode", header + "mode: kernelspace\n",
			nil, `mode "kernelspace": unknown proxy mode; valid modes are nftables, iptables, ipvs, userspace, or auto`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, "kube-proxy.yaml", tt.file)
			_, err := resolve(append([]string{"--manifests", t.TempDir(), "--config", path}, tt.args...)...)
			want := "kp: --config " + path + ": " + strings.ReplaceAll(tt.want, "PATH", path)
			if got := strings.TrimSuffix(stderrOf(err), "\n"); err == nil || got != want {
				t.Errorf("error %v, stderr:\n%s\nwant:\n%s", err, got, want)
			}
		})
	}
}

func TestConfigFileMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope.yaml")
	_, err := resolve("--config", path)
	want := "kp: --config: open " + path + ": no such file or directory\n"
	if err == nil || stderrOf(err) != want {
		t.Errorf("error %v, stderr %q, want %q", err, stderrOf(err), want)
	}
}
