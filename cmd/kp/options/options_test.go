package options

import (
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/proxy"
	"github.com/spf13/pflag"
)

// defaultsFor is the proxy.Config kp proxy runs with when given only
// --manifests dir, on a host named "Node-A.Example".
func defaultsFor(dir string) proxy.Config {
	return proxy.Config{
		Mode:               proxy.ModeNFTables,
		HostnameOverride:   "node-a.example",
		ManifestsDir:       dir,
		NodePortPrimary:    true,
		MasqueradeBit:      14,
		IPTablesBackend:    "auto",
		LocalhostNodePorts: true,
		UserspaceRedirect:  "auto",
		// The userspace mode's: 10,000 connections per service port, TCP
		// idle 24 h, UDP idle 30 s.
		UserspaceMaxConnections: 10000,
		UserspaceTCPIdleTimeout: 24 * time.Hour,
		UserspaceUDPIdleTimeout: 30 * time.Second,
		SyncPeriod:              30 * time.Second,
		MinSyncPeriod:           time.Second,
		ConfigSyncPeriod:        15 * time.Minute,
		DriftCheckPeriod:        500 * time.Millisecond,
		MetricsBindAddress:      "127.0.0.1:10249",
		HealthzBindAddress:      "0.0.0.0:10256",
		StatusSocket:            "/run/kp/kp.sock",
	}
}

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// configOf resolves kp proxy --manifests dir args... as kp proxy does (for
// auto, the settings of the first mode, which kp proxy starts when its probe
// passes) and returns the Config kp would run with.
func configOf(t *testing.T, dir string, args ...string) proxy.Config {
	t.Helper()
	s, err := resolve(append([]string{"--manifests", dir}, args...)...)
	if err == nil && s.Auto {
		s, err = s.ForMode(Modes[0])
	}
	if err != nil {
		t.Fatalf("kp proxy %s: %v", strings.Join(args, " "), err)
	}
	return s.Config
}

// resolve parses args as kp proxy's flags, the root command's logging flags
// included, and resolves them on a host named " Node-A.Example ", as cmd/kp
// does.
func resolve(args ...string) (Settings, error) {
	fs := pflag.NewFlagSet("proxy", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	logFlags := DefaultLogOptions()
	logFlags.AddFlags(fs)
	var o Options
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return Settings{}, err
	}
	if fs.NArg() > 0 {
		return Settings{}, fmt.Errorf("arguments %q", fs.Args())
	}
	return o.Resolve(fs, logFlags, func() (string, error) { return " Node-A.Example ", nil })
}

// stderrOf is what kp prints for err, a setting's error that stops it
// (cmd/kp's run).
func stderrOf(err error) string { return fmt.Sprintf("kp: %v\n", err) }

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestProxyFlagsBecomeConfig(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		args []string
		want func(*proxy.Config)
	}{
		{name: "defaults are kube-proxy's, nftables answers NodePorts on primary IPs", want: func(*proxy.Config) {}},
		{name: "empty proxy mode means nftables", args: []string{"--proxy-mode="}, want: func(*proxy.Config) {}},
		{name: "ipvs flags", args: []string{"--proxy-mode", "ipvs", "--ipvs-scheduler", "mh", "--ipvs-strict-arp",
			"--ipvs-exclude-cidrs", "10.1.0.0/16,fd00:1::/64", "--ipvs-tcp-timeout", "1m", "--ipvs-tcpfin-timeout", "30s",
			"--ipvs-udp-timeout", "5s", "--ipvs-sync-period", "45s", "--ipvs-min-sync-period", "3s"},
			want: func(c *proxy.Config) {
				c.Mode, c.NodePortPrimary = proxy.ModeIPVS, false
				c.SyncPeriod, c.MinSyncPeriod = 45*time.Second, 3*time.Second
				c.IPVS = proxy.IPVSConfig{Scheduler: "mh", StrictARP: true, ExcludeCIDRs: prefixes("10.1.0.0/16", "fd00:1::/64"),
					TCPTimeout: time.Minute, TCPFinTimeout: 30 * time.Second, UDPTimeout: 5 * time.Second}
			}},
		{name: "hostname override is trimmed and lower-cased", args: []string{"--hostname-override", " Worker-7 "},
			want: func(c *proxy.Config) { c.HostnameOverride = "worker-7" }},
		{name: "dual-stack cluster CIDR", args: []string{"--cluster-cidr", "10.244.0.0/16, fd00:10:244::/56"},
			want: func(c *proxy.Config) { c.ClusterCIDRs = prefixes("10.244.0.0/16", "fd00:10:244::/56") }},
		{name: "cluster CIDR with host bits means its network", args: []string{"--cluster-cidr", "10.244.1.7/16"},
			want: func(c *proxy.Config) { c.ClusterCIDRs = prefixes("10.244.0.0/16") }},
		{name: "nodeport CIDRs replace the primary default", args: []string{"--nodeport-addresses", "192.168.0.0/16,fd00::/64"},
			want: func(c *proxy.Config) {
				c.NodePortAddresses, c.NodePortPrimary = prefixes("192.168.0.0/16", "fd00::/64"), false
			}},
		{name: "service CIDRs of both families", args: []string{"--service-cidrs", "10.96.0.0/12, fd00:96::1/108,10.200.0.0/24"},
			want: func(c *proxy.Config) {
				c.ServiceCIDRs = prefixes("10.96.0.0/12", "fd00:96::/108", "10.200.0.0/24")
			}},
		{name: "nodeport primary said explicitly", args: []string{"--nodeport-addresses", "primary"}, want: func(*proxy.Config) {}},
		{name: "masquerade all and mark bit", args: []string{"--masquerade-all", "--iptables-masquerade-bit", "5"},
			want: func(c *proxy.Config) { c.MasqueradeAll, c.MasqueradeBit = true, 5 }},
		{name: "mark bit 0 is allowed", args: []string{"--iptables-masquerade-bit=0"},
			want: func(c *proxy.Config) { c.MasqueradeBit = 0 }},
		{name: "sync periods", args: []string{"--sync-period", "1m", "--min-sync-period", "0", "--config-sync-period", "5m"},
			want: func(c *proxy.Config) {
				c.SyncPeriod, c.MinSyncPeriod, c.ConfigSyncPeriod = time.Minute, 0, 5*time.Minute
			}},
		{name: "the periodic resync as good as off, drift checked every 2s", args: []string{"--sync-period", "8760h", "--drift-check-period", "2s"},
			want: func(c *proxy.Config) { c.SyncPeriod, c.DriftCheckPeriod = 8760*time.Hour, 2*time.Second }},
		{name: "drift repair off", args: []string{"--drift-check-period", "0"},
			want: func(c *proxy.Config) { c.DriftCheckPeriod = 0 }},
		{name: "kube-proxy's older sync flag names", args: []string{"--iptables-sync-period", "45s", "--iptables-min-sync-period", "2s"},
			want: func(c *proxy.Config) { c.SyncPeriod, c.MinSyncPeriod = 45*time.Second, 2*time.Second }},
		{name: "server addresses, empty disables", args: []string{"--metrics-bind-address", "0.0.0.0:10249", "--healthz-bind-address", ""},
			want: func(c *proxy.Config) { c.MetricsBindAddress, c.HealthzBindAddress = "0.0.0.0:10249", "" }},
		{name: "IPv6 bind address moves the default servers to IPv6", args: []string{"--bind-address", "::"},
			want: func(c *proxy.Config) { c.MetricsBindAddress, c.HealthzBindAddress = "[::1]:10249", "[::]:10256" }},
		{name: "kubeconfig and master are kept", args: []string{"--kubeconfig", "/k", "--master", "https://api:6443"},
			want: func(c *proxy.Config) { c.Kubeconfig, c.Master = "/k", "https://api:6443" }},
		{name: "profiling", args: []string{"--profiling"}, want: func(c *proxy.Config) { c.Profiling = true }},
		{name: "mode none through the Node annotation allowed", args: []string{"--allow-mode-none"},
			want: func(c *proxy.Config) { c.AllowModeNone = true }},
		{name: "status socket moved, or disabled", args: []string{"--status-socket", "/run/kp2/s.sock"},
			want: func(c *proxy.Config) { c.StatusSocket = "/run/kp2/s.sock" }},
		{name: "status socket disabled", args: []string{"--status-socket", ""},
			want: func(c *proxy.Config) { c.StatusSocket = "" }},
		{name: "iptables backend and localhost NodePorts", args: []string{"--proxy-mode", "iptables", "--iptables-backend", "legacy",
			"--iptables-localhost-nodeports=false"},
			want: func(c *proxy.Config) {
				c.Mode, c.IPTablesBackend, c.LocalhostNodePorts = proxy.ModeIPTables, "legacy", false
				c.NodePortPrimary = false
			}},
		{name: "iptables mode answers NodePorts on every local IP, as upstream's", args: []string{"--proxy-mode", "iptables"},
			want: func(c *proxy.Config) { c.Mode, c.NodePortPrimary = proxy.ModeIPTables, false }},
		{name: "userspace mode's redirect, connection cap and idle timeouts", args: []string{"--proxy-mode", "userspace",
			"--userspace-redirect", "iptables", "--userspace-max-connections", "0",
			"--userspace-tcp-idle-timeout", "10m", "--userspace-udp-idle-timeout", "5s"},
			want: func(c *proxy.Config) {
				c.Mode, c.NodePortPrimary = proxy.ModeUserspace, false
				c.UserspaceRedirect, c.UserspaceMaxConnections = "iptables", 0
				c.UserspaceTCPIdleTimeout, c.UserspaceUDPIdleTimeout = 10*time.Minute, 5*time.Second
			}},
		{name: "harmless kube-proxy flags change nothing", args: []string{
			"--conntrack-max-per-core=0", "--conntrack-min", "131072", "--oom-score-adj=-999",
			"--kube-api-qps", "20", "--feature-gates", "APIResponseCompression=true,AllAlpha=false",
			"--detect-local-mode", "ClusterCIDR", "--bind-address", "0.0.0.0", "--v", "2", "--log-flush-frequency", "5s",
			"--boot-id-file", "/x", "--machine-id-file", "/y", "--vmodule", "proxier*=5", "--healthz-port", "10256"},
			want: func(c *proxy.Config) { c.DetectLocal.Mode = proxy.LocalModeClusterCIDR }},
		{name: "a bind address without a port takes the deprecated port flag's", args: []string{
			"--healthz-bind-address", "127.0.0.1", "--healthz-port", "9000", "--metrics-bind-address", "::1"},
			want: func(c *proxy.Config) { c.HealthzBindAddress, c.MetricsBindAddress = "127.0.0.1:9000", "[::1]:10249" }},
		{name: "a deprecated port flag of 0 disables its server", args: []string{"--healthz-port", "0", "--metrics-port=0"},
			want: func(c *proxy.Config) { c.HealthzBindAddress, c.MetricsBindAddress = "", "" }},
		{name: "every local traffic detection", args: []string{"--detect-local-mode", "InterfaceNamePrefix",
			"--pod-interface-name-prefix", "veth", "--pod-bridge-interface", "cbr0"},
			want: func(c *proxy.Config) {
				c.DetectLocal = proxy.DetectLocal{Mode: proxy.LocalModeInterfaceNamePrefix, InterfaceNamePrefix: "veth", BridgeInterface: "cbr0"}
			}},
		{name: "a feature gate kp honours", args: []string{"--feature-gates", "AllowServiceExternalIPs=false"},
			want: func(c *proxy.Config) { c.IgnoreExternalIPs = true }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := configOf(t, dir, tt.args...)
			want := defaultsFor(dir)
			tt.want(&want)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("config:\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestProxyFlagErrors(t *testing.T) {
	file := writeFile(t, "plain-file", "")
	missing := filepath.Join(t.TempDir(), "missing")
	tests := []struct {
		name string
		args []string
		want string // the whole of stderr
	}{
		{"invalid cluster CIDR", []string{"--cluster-cidr", "10.0.0.0/33"},
			`kp: --cluster-cidr "10.0.0.0/33": invalid CIDR`},
		{"invalid CIDR in a dual-stack pair", []string{"--cluster-cidr", "10.0.0.0/8,fd00::/129"},
			`kp: --cluster-cidr "10.0.0.0/8,fd00::/129": invalid CIDR "fd00::/129"`},
		{"two cluster CIDRs of one family", []string{"--cluster-cidr", "10.0.0.0/8,10.1.0.0/16"},
			`kp: --cluster-cidr "10.0.0.0/8,10.1.0.0/16": want one CIDR, or one IPv4 and one IPv6 CIDR for dual-stack`},
		{"primary mixed with CIDRs", []string{"--nodeport-addresses", "primary,10.0.0.0/8"},
			`kp: --nodeport-addresses "primary,10.0.0.0/8": 'primary' cannot be combined with CIDRs`},
		{"invalid nodeport CIDR", []string{"--nodeport-addresses", "10.0.0.1"},
			`kp: --nodeport-addresses "10.0.0.1": invalid CIDR`},
		{"invalid service CIDR", []string{"--service-cidrs", "10.96.0.0/12,10.300.0.0/16"},
			`kp: --service-cidrs "10.96.0.0/12,10.300.0.0/16": invalid CIDR "10.300.0.0/16"`},
		{"service CIDR without a length", []string{"--service-cidrs", "10.96.0.1"},
			`kp: --service-cidrs "10.96.0.1": invalid CIDR`},
		{"service CIDR covering everything", []string{"--service-cidrs", "0.0.0.0/0"},
			`kp: --service-cidrs "0.0.0.0/0": 0.0.0.0/0 covers every address; give the Service CIDRs only`},
		{"unknown userspace redirect", []string{"--userspace-redirect", "ipvs"},
			`kp: --userspace-redirect "ipvs": want auto, nftables or iptables`},
		{"zero UDP idle timeout", []string{"--userspace-udp-idle-timeout", "0"},
			`kp: --userspace-udp-idle-timeout "0s": must be greater than 0`},
		{"negative connection cap", []string{"--userspace-max-connections", "-1"},
			`kp: --userspace-max-connections "-1": must not be negative`},
		{"mark bit out of range", []string{"--iptables-masquerade-bit", "32"},
			`kp: --iptables-masquerade-bit "32": must be within [0, 31]`},
		{"zero sync period", []string{"--sync-period", "0"},
			`kp: --sync-period "0s": must be greater than 0`},
		{"negative drift check period", []string{"--drift-check-period", "-1s"},
			`kp: --drift-check-period "-1s": must not be negative`},
		{"negative min sync period", []string{"--min-sync-period=-1s"},
			`kp: --min-sync-period "-1s": must not be negative`},
		{"min sync period above sync period", []string{"--min-sync-period", "1m"},
			`kp: --min-sync-period 1m0s is longer than --sync-period 30s`},
		{"unknown mode", []string{"--proxy-mode", "kernelspace"},
			`kp: --proxy-mode "kernelspace": unknown proxy mode; valid modes are nftables, iptables, ipvs, userspace, or auto`},
		{"unknown iptables backend", []string{"--iptables-backend", "xtables"},
			`kp: --iptables-backend "xtables": want auto, nft or legacy`},
		{"unknown IPVS scheduler", []string{"--ipvs-scheduler", "fastest"},
			`kp: --ipvs-scheduler "fastest": unknown IPVS scheduler; use one of rr, wrr, lc, wlc, lblc, lblcr, dh, sh, sed, nq, mh, fo, ovf, twos`},
		{"healthz address not an address", []string{"--healthz-bind-address", "everywhere"},
			`kp: --healthz-bind-address "everywhere": want IP:port, for example 0.0.0.0:10256`},
		{"metrics address not an IP", []string{"--metrics-bind-address", "localhost:10249"},
			`kp: --metrics-bind-address "localhost:10249": "localhost" is not an IP address`},
		{"node IP override", []string{"--bind-address", "10.0.0.5"},
			`kp: --bind-address "10.0.0.5": kp does not support overriding the node's primary IP; leave it unset, 0.0.0.0 or ::`},
		{"unknown local traffic detection", []string{"--detect-local-mode", "PodLabel"},
			`kp: --detect-local-mode "PodLabel": Unsupported value: "PodLabel": supported values: "ClusterCIDR", "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix", ""`},
		{"interface prefix detection without a prefix", []string{"--detect-local-mode", "InterfaceNamePrefix"},
			`kp: --pod-interface-name-prefix: Invalid value: "": must not be empty with detectLocalMode InterfaceNamePrefix`},
		{"unknown feature gate, as upstream words it", []string{"--feature-gates", "SomeAlphaThing=true,APIResponseCompression=true"},
			`kp: --feature-gates: unrecognized feature gate: SomeAlphaThing`},
		{"a locked feature gate set against its default", []string{"--feature-gates", "AnyVolumeDataSource=false"},
			`kp: --feature-gates: cannot set feature gate AnyVolumeDataSource to false, feature is locked to true`},
		{"a gate enabled without the gates it depends on", []string{"--feature-gates", "WorkloadWithJob=true"},
			`kp: --feature-gates: WorkloadWithJob is enabled, but depends on features that are disabled: [GenericWorkload]`},
		{"split log streams without LoggingAlphaOptions", []string{"--log-json-split-stream", "--logging-format", "json"},
			`kp: --log-json-split-stream: Forbidden: Feature LoggingAlphaOptions is disabled`},
		{"vmodule with json logs", []string{"--vmodule", "x=2", "--logging-format", "json"},
			`kp: --vmodule: Forbidden: Only supported for text log format`},
		{"unknown log format", []string{"--log-format", "xml"},
			`kp: --logging-format "xml": must be text or json`},
		{"manifests folder missing", []string{"--manifests", missing},
			fmt.Sprintf(`kp: --manifests %q: stat %s: no such file or directory`, missing, missing)},
		{"manifests not a folder", []string{"--manifests", file},
			fmt.Sprintf(`kp: --manifests %q: not a directory`, file)},
		{"every error at once", []string{"--cluster-cidr", "x", "--iptables-masquerade-bit", "99"},
			"kp: --cluster-cidr \"x\": invalid CIDR\n--iptables-masquerade-bit \"99\": must be within [0, 31]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := tt.args
			if !strings.HasPrefix(tt.name, "manifests") {
				args = append([]string{"--manifests", t.TempDir()}, args...)
			}
			_, err := resolve(args...)
			if err == nil {
				t.Fatalf("resolved without an error; want one")
			}
			if got := strings.TrimSuffix(stderrOf(err), "\n"); got != tt.want {
				t.Errorf("stderr:\n%s\nwant:\n%s", got, tt.want)
			}
		})
	}
}
