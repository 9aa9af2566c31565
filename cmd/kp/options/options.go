package options

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
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
	// healthzPort and metricsPort are upstream's ports.ProxyHealthzPort and
	// ProxyStatusPort: --healthz-port's and --metrics-port's defaults.
	healthzPort, metricsPort    = 10256, 10249
	defaultMetricsBindAddressV6 = "[::1]:10249"
	defaultHealthzBindAddressV6 = "[::]:10256"
)

// Options holds kp proxy's flags as parsed. Upstream's names and meanings;
// Resolve turns them, with the --config file, into Settings.
type Options struct {
	configFile string
	// loaded is a configuration already decoded, in place of configFile's
	// (SettingsFromConfig).
	loaded  *fileConfig
	Cleanup bool // --cleanup: cmd/kp cleans up instead of proxying
	// InitOnly (--init-only): cmd/kp does what needs full privileges (the
	// node's sysctls, as kp sysctl) and exits, as upstream.
	InitOnly bool
	// WriteConfigTo (--write-config-to): cmd/kp writes the effective
	// configuration there (Settings.WriteConfig) and exits, as upstream.
	WriteConfigTo string
	// Version (--version): cmd/kp prints its version and exits.
	Version versionFlag

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
	driftCheckPeriod      time.Duration

	metricsBindAddress string
	profiling          bool
	healthzBindAddress string
	// Upstream's deprecated --healthz-port and --metrics-port: 0 disables
	// the server, another port completes a bind address given without one.
	healthzPort, metricsPort int32
	allowModeNone            bool
	statusSocket             string

	ipvs ipvsOptions

	conntrack conntrackOptions
	compat    compatOptions
}

// AddFlags binds kp proxy's flags (those of kp sysctl too) to o.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.configFile, "config", "",
		"Path to a KubeProxyConfiguration file (apiVersion kubeproxy.config.k8s.io/v1alpha1). As upstream: with it, "+
			"the flags that have a field in the file are ignored (logged at start), and kp exits when the file changes. "+
			"Fields kp does not support are reported as errors.")
	fs.StringVar(&o.WriteConfigTo, "write-config-to", "",
		"If set, write the effective configuration (defaults, then --config or the flags) to this file as a "+
			"KubeProxyConfiguration and exit.")
	fs.BoolVar(&o.Cleanup, "cleanup", false, "Remove everything kp wrote to the kernel, then exit (same as 'kp cleanup').")
	fs.BoolVar(&o.InitOnly, "init-only", false,
		"If true, perform the initialization steps that need full root privileges (the node's sysctls, as 'kp sysctl'), "+
			"and then exit. After doing this, kp can run again with only the CAP_NET_ADMIN capability.")
	o.Version.addFlag(fs)

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
		"How often the kernel state is fully reconciled even when nothing changed. Must be greater than 0; "+
			"a very large value (8760h) turns the periodic resync off, and drift repair (--drift-check-period) "+
			"still repairs what other processes change.")
	fs.DurationVar(&o.minSyncPeriod, "min-sync-period", defaultMinSyncPeriod,
		"The minimum time between syncs; changes arriving faster are batched. 0 syncs every change at once.")
	fs.DurationVar(&o.iptablesSyncPeriod, "iptables-sync-period", defaultSyncPeriod,
		"Upstream's --sync-period for every mode but ipvs (--sync-period, kp's name, wins). Must be greater than 0.")
	fs.DurationVar(&o.iptablesMinSyncPeriod, "iptables-min-sync-period", defaultMinSyncPeriod,
		"Upstream's --min-sync-period for every mode but ipvs (--min-sync-period, kp's name, wins).")
	fs.DurationVar(&o.configSyncPeriod, "config-sync-period", defaultConfigSyncPeriod,
		"Upstream's informer resync period; accepted and without effect in kp, which keeps no informer cache "+
			"(a resync re-delivers unchanged objects). Must be greater than 0.")

	fs.DurationVar(&o.driftCheckPeriod, "drift-check-period", proxy.DefaultDriftCheckPeriod,
		"kp only: how often the iptables, ipvs and userspace modes compare their rules in the kernel with what kp "+
			"wrote, to repair at once what another process changed (the nftables mode hears of such changes from the "+
			"kernel); each repair is logged and counted in kp_rules_drift_repairs_total. 0 turns drift repair off in every mode.")

	fs.StringVar(&o.metricsBindAddress, "metrics-bind-address", defaultMetricsBindAddress,
		"IP address and port of the metrics server ('0.0.0.0:10249' for all IPv4 interfaces). Empty or port 0 disables it.")
	fs.BoolVar(&o.profiling, "profiling", false,
		"Serve Go's profiles at /debug/pprof/ on the metrics server, as upstream does.")
	fs.StringVar(&o.healthzBindAddress, "healthz-bind-address", defaultHealthzBindAddress,
		"IP address and port of the health check server that load balancers probe. Empty or port 0 disables it.")
	fs.Int32Var(&o.healthzPort, "healthz-port", healthzPort, "The port to bind the health check server. Use 0 to disable.")
	_ = fs.MarkDeprecated("healthz-port", "This flag is deprecated and will be removed in a future release. Please use --healthz-bind-address instead.")
	fs.Int32Var(&o.metricsPort, "metrics-port", metricsPort, "The port to bind the metrics server. Use 0 to disable.")
	_ = fs.MarkDeprecated("metrics-port", "This flag is deprecated and will be removed in a future release. Please use --metrics-bind-address instead.")

	fs.StringVar(&o.statusSocket, "status-socket", server.DefaultStatusSocket,
		"kp only: the Unix socket of kp's status API (status, services, inventory, mode switches, profiles), which kp "+
			"top, kp flows, kp status and kp migrate use; kp makes it mode 0600 in a directory of mode 0700, so only "+
			"root on the node (or kubectl exec into kp's pod) opens it. None of it is served on the network. Empty disables it.")
	fs.BoolVar(&o.allowModeNone, "allow-mode-none", false,
		"kp only: let the Node annotation "+proxy.AnnotationProxyMode+"=none switch kp to mode none (kp removes its "+
			"rules and programs nothing; kp migrate cluster --rollback does this to hand a node back to kube-proxy). "+
			"Without it that annotation is refused with an Event on the Node and nothing changes, so whoever may "+
			"patch Nodes cannot take the node's Services offline.")

	o.ipvs.addFlags(fs)
	o.conntrack.addFlags(fs)
	o.userspace.addFlags(fs)
	o.compat.addFlags(fs)
}

// apply overrides s with every flag that changed reports set and in force
// (see flagsInForce). Every problem is reported, in the order of the
// sections below.
func (o *Options) apply(changed func(string) bool, logFlags LogOptions, s *Settings) []error {
	m := &flagMerge{changed: changed, s: s}
	o.applySource(m)
	o.applyNetworks(m)
	o.applyDurations(m)
	o.applyServers(m)
	s.Log.applyFlags(changed, logFlags)

	errs := m.errs
	errs = append(errs, o.ipvs.apply(changed, s)...)
	errs = append(errs, o.conntrack.apply(changed, s)...)
	errs = append(errs, o.userspace.apply(changed, s)...)
	errs = append(errs, o.compat.apply(changed, s)...)
	return errs
}

// flagMerge is one merge of the flags set on the command line into s, and
// the problems found.
type flagMerge struct {
	changed func(name string) bool
	s       *Settings
	errs    []error
}

func (m *flagMerge) fail(flag, value string, err error) {
	m.errs = append(m.errs, fmt.Errorf("--%s %q: %w", flag, value, err))
}

// applySource sets where Services come from and the node's name.
func (o *Options) applySource(m *flagMerge) {
	c := &m.s.Config
	if m.changed("kubeconfig") {
		c.Kubeconfig = o.kubeconfig
	}
	if m.changed("master") {
		c.Master = o.master
	}
	if m.changed("manifests") {
		c.ManifestsDir = o.manifests
	}
	if m.changed("hostname-override") {
		c.HostnameOverride = o.hostnameOverride
	}
}

// applyNetworks sets the CIDRs, the masquerade settings and the iptables
// mode's own.
func (o *Options) applyNetworks(m *flagMerge) {
	c := &m.s.Config
	if m.changed("cluster-cidr") {
		cidrs, err := parseClusterCIDRs(o.clusterCIDR)
		if err != nil {
			m.fail("cluster-cidr", o.clusterCIDR, err)
		}
		c.ClusterCIDRs = cidrs
	}
	if m.changed("nodeport-addresses") {
		cidrs, primary, err := parseNodePortAddresses(o.nodePortAddresses)
		if err != nil {
			m.fail("nodeport-addresses", strings.Join(o.nodePortAddresses, ","), err)
		}
		c.NodePortAddresses, c.NodePortPrimary = cidrs, primary
	}
	if m.changed("service-cidrs") {
		cidrs, err := parseServiceCIDRs(o.serviceCIDRs)
		if err != nil {
			m.fail("service-cidrs", o.serviceCIDRs, err)
		}
		c.ServiceCIDRs = cidrs
	}
	if m.changed("masquerade-all") {
		c.MasqueradeAll = o.masqueradeAll
	}
	if m.changed("iptables-backend") {
		if _, err := iptables.ParseFlavor(o.iptablesBackend); err != nil {
			m.fail("iptables-backend", o.iptablesBackend, errors.New("want auto, nft or legacy"))
		}
		c.IPTablesBackend = o.iptablesBackend
	}
	if m.changed("iptables-localhost-nodeports") {
		c.LocalhostNodePorts = o.iptablesLocalhostNodePorts
	}
	if m.changed("iptables-masquerade-bit") {
		if err := checkMasqueradeBit(o.masqueradeBit); err != nil {
			m.fail("iptables-masquerade-bit", strconv.Itoa(int(o.masqueradeBit)), err)
		}
		c.MasqueradeBit = int(o.masqueradeBit)
	}
}

// applyDurations sets the sync periods, from kp's names or, when those are
// not set, upstream's (--iptables-*, which upstream reads in every mode but
// ipvs; ipvsOptions reads --ipvs-* in ipvs mode).
func (o *Options) applyDurations(m *flagMerge) {
	c := &m.s.Config
	notIPVS := c.Mode != proxy.ModeIPVS
	durations := []struct {
		flags []string // the current name first, then upstream's older one
		vals  []time.Duration
		dst   *time.Duration
		zero  bool // whether 0 is allowed
	}{
		{[]string{"sync-period", "iptables-sync-period"}, []time.Duration{o.syncPeriod, o.iptablesSyncPeriod}, &c.SyncPeriod, false},
		{[]string{"min-sync-period", "iptables-min-sync-period"}, []time.Duration{o.minSyncPeriod, o.iptablesMinSyncPeriod}, &c.MinSyncPeriod, true},
		{[]string{"config-sync-period"}, []time.Duration{o.configSyncPeriod}, &c.ConfigSyncPeriod, false},
		{[]string{"drift-check-period"}, []time.Duration{o.driftCheckPeriod}, &c.DriftCheckPeriod, true},
	}
	for _, d := range durations {
		for i, name := range d.flags {
			if !m.changed(name) || (i > 0 && !notIPVS) {
				continue
			}
			if err := checkDuration(d.vals[i], d.zero); err != nil {
				m.fail(name, d.vals[i].String(), err)
			}
			*d.dst = d.vals[i]
			break
		}
	}
}

// applyServers sets the metrics and health check servers. As upstream, a
// bind address given without a port takes --healthz-port's or
// --metrics-port's (by default the usual one), and a port flag set to 0
// disables its server. It also sets what the Node annotation may ask of kp.
func (o *Options) applyServers(m *flagMerge) {
	c := &m.s.Config
	for _, srv := range []struct {
		flag, portFlag string
		addr           string
		port           int32
		dst            *string
	}{
		{"metrics-bind-address", "metrics-port", o.metricsBindAddress, o.metricsPort, &c.MetricsBindAddress},
		{"healthz-bind-address", "healthz-port", o.healthzBindAddress, o.healthzPort, &c.HealthzBindAddress},
	} {
		if m.changed(srv.flag) {
			addr := srv.addr
			if ip, err := netip.ParseAddr(strings.Trim(addr, "[]")); err == nil {
				addr = net.JoinHostPort(ip.String(), strconv.Itoa(int(srv.port)))
			}
			if err := checkBindAddress(addr); err != nil {
				m.fail(srv.flag, srv.addr, err)
			}
			*srv.dst = addr
		}
		if m.changed(srv.portFlag) && srv.port == 0 {
			*srv.dst = ""
		}
	}
	if m.changed("profiling") {
		c.Profiling = o.profiling
	}
	if m.changed("allow-mode-none") {
		c.AllowModeNone = o.allowModeNone
	}
	if m.changed("status-socket") {
		c.StatusSocket = o.statusSocket
	}
}
