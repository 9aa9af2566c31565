package options

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/kpproxy/kp/legacy/iptables"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/server"
)

// Upstream kube-proxy's defaults, which kp keeps so a DaemonSet behaves the same.
const (
	defaultMasqueradeBit      = 14
	defaultSyncPeriod         = server.DefaultSyncPeriod
	defaultMinSyncPeriod      = server.DefaultMinSyncPeriod
	defaultConfigSyncPeriod   = 15 * time.Minute
	defaultMetricsBindAddress = server.DefaultMetricsBindAddress
	defaultHealthzBindAddress = server.DefaultHealthzBindAddress
	// With an IPv6 --bind-address upstream moves both servers to IPv6.
	defaultMetricsBindAddressV6 = "[::1]:10249"
	defaultHealthzBindAddressV6 = "[::]:10256"
)

// Options holds kp proxy's flags as parsed. Upstream's names and meanings;
// Resolve turns them, with the --config file, into Settings.
type Options struct {
	configFile string
	Cleanup    bool // --cleanup: cmd/kp cleans up instead of proxying

	mode              string
	forcedMode        proxy.Mode // set by Settings.ForMode, beats the flag and the file
	kubeconfig        string
	master            string
	manifests         string
	hostnameOverride  string
	clusterCIDR       string
	nodePortAddresses []string
	serviceCIDRs      string
	masqueradeAll     bool
	masqueradeBit     int32

	iptablesBackend            string
	iptablesLocalhostNodePorts bool

	userspace userspaceOptions

	syncPeriod            time.Duration
	minSyncPeriod         time.Duration
	iptablesSyncPeriod    time.Duration // upstream's older name for --sync-period
	iptablesMinSyncPeriod time.Duration // upstream's older name for --min-sync-period
	configSyncPeriod      time.Duration

	metricsBindAddress string
	profiling          bool
	healthzBindAddress string

	ipvs ipvsOptions

	conntrack conntrackOptions
	compat    compatOptions
}

// AddFlags binds kp proxy's flags (those of kp sysctl too) to o.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.configFile, "config", "",
		"Path to a KubeProxyConfiguration file (apiVersion kubeproxy.config.k8s.io/v1alpha1). "+
			"Fields kp does not support are reported as errors; flags set on the command line override the file.")
	fs.BoolVar(&o.Cleanup, "cleanup", false, "Remove everything kp wrote to the kernel, then exit (same as 'kp cleanup').")

	fs.StringVar(&o.mode, "proxy-mode", "auto",
		"Which proxy mode to use: nftables, iptables, ipvs or userspace, or auto "+
			"(the default, also when empty) for the first of nftables, iptables, ipvs, userspace that this node's kernel runs.")
	fs.StringVar(&o.iptablesBackend, "iptables-backend", "auto",
		"kp only: the iptables binaries the iptables mode uses: nft (iptables-nft), legacy (iptables-legacy), "+
			"or auto to choose as upstream's iptables-wrapper does (the flavor already holding rules).")
	fs.BoolVar(&o.iptablesLocalhostNodePorts, "iptables-localhost-nodeports", true,
		"In iptables mode, answer IPv4 NodePorts on 127.0.0.0/8 too (sets net.ipv4.conf.all.route_localnet=1), "+
			"when NodePorts answer on every local address.")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Path to a kubeconfig file with the API server's location and credentials.")
	fs.StringVar(&o.master, "master", "", "The address of the Kubernetes API server (overrides the kubeconfig's).")
	fs.StringVar(&o.manifests, "manifests", "",
		"Read Services and EndpointSlices from the YAML/JSON files in this directory (reloaded on change) "+
			"instead of the Kubernetes API.")
	fs.StringVar(&o.hostnameOverride, "hostname-override", "",
		"The name of this node, if not the host name. Endpoints' nodeName and the Node object are matched against it.")
	fs.StringVar(&o.clusterCIDR, "cluster-cidr", "",
		"The pods' CIDR range, or an IPv4,IPv6 pair for dual-stack. Traffic to a Service from outside it is masqueraded.")
	fs.StringSliceVar(&o.nodePortAddresses, "nodeport-addresses", nil,
		"CIDR ranges of the node IPs that answer NodePorts, or the single word 'primary' for the node's primary IPs "+
			"(the default in nftables mode).")
	fs.StringVar(&o.serviceCIDRs, "service-cidrs", "",
		"kp only: the cluster's Service CIDRs, comma-separated (for example 10.96.0.0/12,fd00:96::/108). Traffic to an "+
			"unallocated address inside them is dropped. With the Kubernetes API, ServiceCIDR objects add theirs; "+
			"with --manifests this flag (or ServiceCIDR manifests) is the only source.")
	fs.BoolVar(&o.masqueradeAll, "masquerade-all", false, "Masquerade (SNAT) all traffic sent to Service addresses.")
	fs.Int32Var(&o.masqueradeBit, "iptables-masquerade-bit", defaultMasqueradeBit,
		"The bit of the packet mark that flags packets for masquerade, in every mode. Must be within [0, 31].")

	fs.DurationVar(&o.syncPeriod, "sync-period", defaultSyncPeriod,
		"How often the kernel state is fully reconciled even when nothing changed. Must be greater than 0.")
	fs.DurationVar(&o.minSyncPeriod, "min-sync-period", defaultMinSyncPeriod,
		"The minimum time between syncs; changes arriving faster are batched. 0 syncs every change at once.")
	fs.DurationVar(&o.iptablesSyncPeriod, "iptables-sync-period", defaultSyncPeriod, "Old name of --sync-period.")
	fs.DurationVar(&o.iptablesMinSyncPeriod, "iptables-min-sync-period", defaultMinSyncPeriod, "Old name of --min-sync-period.")
	_ = fs.MarkHidden("iptables-sync-period")
	_ = fs.MarkHidden("iptables-min-sync-period")
	fs.DurationVar(&o.configSyncPeriod, "config-sync-period", defaultConfigSyncPeriod,
		"Upstream's informer resync period; accepted and without effect in kp, which keeps no informer cache "+
			"(a resync re-delivers unchanged objects). Must be greater than 0.")

	fs.StringVar(&o.metricsBindAddress, "metrics-bind-address", defaultMetricsBindAddress,
		"IP address and port of the metrics server ('0.0.0.0:10249' for all IPv4 interfaces). Empty or port 0 disables it.")
	fs.BoolVar(&o.profiling, "profiling", false,
		"Serve Go's profiles at /debug/pprof/ on the metrics server, as upstream does.")
	fs.StringVar(&o.healthzBindAddress, "healthz-bind-address", defaultHealthzBindAddress,
		"IP address and port of the health check server that load balancers probe. Empty or port 0 disables it.")

	o.ipvs.addFlags(fs)
	o.conntrack.addFlags(fs)
	o.userspace.addFlags(fs)
	o.compat.addFlags(fs)
}

// apply overrides s with every flag set on the command line.
func (o *Options) apply(fs *pflag.FlagSet, logFlags LogOptions, s *Settings) []error {
	var errs []error
	changed := fs.Changed
	fail := func(flag, value string, err error) {
		errs = append(errs, fmt.Errorf("--%s %q: %w", flag, value, err))
	}

	if changed("kubeconfig") {
		s.Config.Kubeconfig = o.kubeconfig
	}
	if changed("master") {
		s.Config.Master = o.master
	}
	if changed("manifests") {
		s.Config.ManifestsDir = o.manifests
	}
	if changed("hostname-override") {
		s.Config.HostnameOverride = o.hostnameOverride
	}
	if changed("cluster-cidr") {
		cidrs, err := parseClusterCIDRs(o.clusterCIDR)
		if err != nil {
			fail("cluster-cidr", o.clusterCIDR, err)
		}
		s.Config.ClusterCIDRs = cidrs
	}
	if changed("nodeport-addresses") {
		cidrs, primary, err := parseNodePortAddresses(o.nodePortAddresses)
		if err != nil {
			fail("nodeport-addresses", strings.Join(o.nodePortAddresses, ","), err)
		}
		s.Config.NodePortAddresses, s.Config.NodePortPrimary = cidrs, primary
	}
	if changed("service-cidrs") {
		cidrs, err := parseServiceCIDRs(o.serviceCIDRs)
		if err != nil {
			fail("service-cidrs", o.serviceCIDRs, err)
		}
		s.Config.ServiceCIDRs = cidrs
	}
	if changed("masquerade-all") {
		s.Config.MasqueradeAll = o.masqueradeAll
	}
	if changed("iptables-backend") {
		if _, err := iptables.ParseFlavor(o.iptablesBackend); err != nil {
			fail("iptables-backend", o.iptablesBackend, errors.New("want auto, nft or legacy"))
		}
		s.Config.IPTablesBackend = o.iptablesBackend
	}
	if changed("iptables-localhost-nodeports") {
		s.Config.LocalhostNodePorts = o.iptablesLocalhostNodePorts
	}
	if changed("iptables-masquerade-bit") {
		if err := checkMasqueradeBit(o.masqueradeBit); err != nil {
			fail("iptables-masquerade-bit", strconv.Itoa(int(o.masqueradeBit)), err)
		}
		s.Config.MasqueradeBit = int(o.masqueradeBit)
	}

	durations := []struct {
		flags []string // the current name first, then upstream's older one
		vals  []time.Duration
		dst   *time.Duration
		zero  bool // whether 0 is allowed
	}{
		{[]string{"sync-period", "iptables-sync-period"}, []time.Duration{o.syncPeriod, o.iptablesSyncPeriod}, &s.Config.SyncPeriod, false},
		{[]string{"min-sync-period", "iptables-min-sync-period"}, []time.Duration{o.minSyncPeriod, o.iptablesMinSyncPeriod}, &s.Config.MinSyncPeriod, true},
		{[]string{"config-sync-period"}, []time.Duration{o.configSyncPeriod}, &s.Config.ConfigSyncPeriod, false},
	}
	for _, d := range durations {
		for i, name := range d.flags {
			if !changed(name) {
				continue
			}
			if err := checkDuration(d.vals[i], d.zero); err != nil {
				fail(name, d.vals[i].String(), err)
			}
			*d.dst = d.vals[i]
			break
		}
	}

	if changed("metrics-bind-address") {
		if err := checkBindAddress(o.metricsBindAddress); err != nil {
			fail("metrics-bind-address", o.metricsBindAddress, err)
		}
		s.Config.MetricsBindAddress = o.metricsBindAddress
	}
	if changed("profiling") {
		s.Config.Profiling = o.profiling
	}
	if changed("healthz-bind-address") {
		if err := checkBindAddress(o.healthzBindAddress); err != nil {
			fail("healthz-bind-address", o.healthzBindAddress, err)
		}
		s.Config.HealthzBindAddress = o.healthzBindAddress
	}

	if changed("log-format") || changed("logging-format") {
		s.Log.format = logFlags.format
	}
	if changed("v") {
		s.Log.verbosity = logFlags.verbosity
	}

	errs = append(errs, o.ipvs.apply(fs, s)...)
	errs = append(errs, o.conntrack.apply(fs, s)...)
	errs = append(errs, o.userspace.apply(fs, s)...)
	errs = append(errs, o.compat.apply(fs, s)...)
	return errs
}
