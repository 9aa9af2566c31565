package main

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/kpproxy/kp/conntrack"
	"github.com/kpproxy/kp/legacy/iptables"
	"github.com/kpproxy/kp/legacy/userspace"
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

// proxyOptions holds kp proxy's flags as parsed. Upstream's names and meanings;
// settings() turns them, with the --config file, into a proxy.Config.
type proxyOptions struct {
	configFile string
	cleanup    bool

	mode              string
	forcedMode        proxy.Mode // set by settings.forMode, beats the flag and the file
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

func (o *proxyOptions) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.configFile, "config", "",
		"Path to a KubeProxyConfiguration file (apiVersion kubeproxy.config.k8s.io/v1alpha1). "+
			"Fields kp does not support are reported as errors; flags set on the command line override the file.")
	fs.BoolVar(&o.cleanup, "cleanup", false, "Remove everything kp wrote to the kernel, then exit (same as 'kp cleanup').")

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

// settings is everything kp proxy resolved from flags and the config file.
type settings struct {
	cfg proxy.Config
	// conntrack is what kp sets in the node's conntrack at start.
	conntrack conntrack.Tuning
	log       logOptions
	// modeFrom says where the mode came from, for "not implemented" errors.
	modeFrom string
	// forMode is set when the mode is auto: the settings again with the
	// mode forced to m (each mode reads its own section of the config
	// file and has its own defaults), for choosing the mode (mode.go).
	forMode func(m proxy.Mode) (settings, error)
	// bindAddressV6 is an IPv6 unspecified --bind-address, which moves the
	// default server addresses to IPv6 as upstream does.
	bindAddressV6 bool
	// ignored lists settings kp accepts for compatibility but does not act on;
	// they are logged once the logger is final.
	ignored []ignoredSetting
}

type ignoredSetting struct {
	name   string // "--conntrack-max-per-core" or "conntrack.maxPerCore in kube-proxy.yaml"
	reason string
}

func defaultSettings() settings {
	return settings{
		cfg: proxy.Config{
			Mode:                    proxy.ModeNFTables,
			MasqueradeBit:           defaultMasqueradeBit,
			IPTablesBackend:         string(iptables.FlavorAuto),
			LocalhostNodePorts:      true,
			UserspaceRedirect:       userspace.RedirectAuto,
			UserspaceMaxConnections: defaultUserspaceMaxConnections,
			UserspaceTCPIdleTimeout: defaultUserspaceTCPIdleTimeout,
			UserspaceUDPIdleTimeout: defaultUserspaceUDPIdleTimeout,
			SyncPeriod:              defaultSyncPeriod,
			MinSyncPeriod:           defaultMinSyncPeriod,
			ConfigSyncPeriod:        defaultConfigSyncPeriod,
			MetricsBindAddress:      defaultMetricsBindAddress,
			HealthzBindAddress:      defaultHealthzBindAddress,
		},
		conntrack: conntrack.DefaultTuning(),
		log:       defaultLogOptions(),
	}
}

// settings merges defaults, then the --config file, then every flag set on
// the command line. (Upstream lets only --hostname-override and the logging
// flags beat its file and silently drops the rest; kp lets every explicit
// flag win, so no argument in a DaemonSet is ignored without a word.) fs is
// the parsed command's flag set, including the root's logging flags, whose
// values are logFlags.
func (o *proxyOptions) settings(fs *pflag.FlagSet, logFlags logOptions, hostname func() (string, error)) (settings, error) {
	s := defaultSettings()

	// The mode decides which section of the file applies (nftables.*,
	// iptables.*), so it is resolved first; the flag beats the file.
	var file *fileConfig
	if o.configFile != "" {
		f, err := loadConfigFile(o.configFile)
		if err != nil {
			return s, err
		}
		file = f
	}
	if err := o.resolveMode(fs, file, &s, logFlags, hostname); err != nil {
		return s, err
	}

	var errs []error
	if file != nil {
		errs = append(errs, file.apply(&s)...)
	}
	errs = append(errs, o.apply(fs, logFlags, &s)...)
	if len(errs) == 0 {
		errs = append(errs, s.finish(hostname)...)
	}
	return s, errors.Join(errs...)
}

// apply overrides s with every flag set on the command line.
func (o *proxyOptions) apply(fs *pflag.FlagSet, logFlags logOptions, s *settings) []error {
	var errs []error
	changed := fs.Changed
	fail := func(flag, value string, err error) {
		errs = append(errs, fmt.Errorf("--%s %q: %w", flag, value, err))
	}

	if changed("kubeconfig") {
		s.cfg.Kubeconfig = o.kubeconfig
	}
	if changed("master") {
		s.cfg.Master = o.master
	}
	if changed("manifests") {
		s.cfg.ManifestsDir = o.manifests
	}
	if changed("hostname-override") {
		s.cfg.HostnameOverride = o.hostnameOverride
	}
	if changed("cluster-cidr") {
		cidrs, err := parseClusterCIDRs(o.clusterCIDR)
		if err != nil {
			fail("cluster-cidr", o.clusterCIDR, err)
		}
		s.cfg.ClusterCIDRs = cidrs
	}
	if changed("nodeport-addresses") {
		cidrs, primary, err := parseNodePortAddresses(o.nodePortAddresses)
		if err != nil {
			fail("nodeport-addresses", strings.Join(o.nodePortAddresses, ","), err)
		}
		s.cfg.NodePortAddresses, s.cfg.NodePortPrimary = cidrs, primary
	}
	if changed("service-cidrs") {
		cidrs, err := parseServiceCIDRs(o.serviceCIDRs)
		if err != nil {
			fail("service-cidrs", o.serviceCIDRs, err)
		}
		s.cfg.ServiceCIDRs = cidrs
	}
	if changed("masquerade-all") {
		s.cfg.MasqueradeAll = o.masqueradeAll
	}
	if changed("iptables-backend") {
		if _, err := iptables.ParseFlavor(o.iptablesBackend); err != nil {
			fail("iptables-backend", o.iptablesBackend, errors.New("want auto, nft or legacy"))
		}
		s.cfg.IPTablesBackend = o.iptablesBackend
	}
	if changed("iptables-localhost-nodeports") {
		s.cfg.LocalhostNodePorts = o.iptablesLocalhostNodePorts
	}
	if changed("iptables-masquerade-bit") {
		if err := checkMasqueradeBit(o.masqueradeBit); err != nil {
			fail("iptables-masquerade-bit", strconv.Itoa(int(o.masqueradeBit)), err)
		}
		s.cfg.MasqueradeBit = int(o.masqueradeBit)
	}

	durations := []struct {
		flags []string // the current name first, then upstream's older one
		vals  []time.Duration
		dst   *time.Duration
		zero  bool // whether 0 is allowed
	}{
		{[]string{"sync-period", "iptables-sync-period"}, []time.Duration{o.syncPeriod, o.iptablesSyncPeriod}, &s.cfg.SyncPeriod, false},
		{[]string{"min-sync-period", "iptables-min-sync-period"}, []time.Duration{o.minSyncPeriod, o.iptablesMinSyncPeriod}, &s.cfg.MinSyncPeriod, true},
		{[]string{"config-sync-period"}, []time.Duration{o.configSyncPeriod}, &s.cfg.ConfigSyncPeriod, false},
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
		s.cfg.MetricsBindAddress = o.metricsBindAddress
	}
	if changed("profiling") {
		s.cfg.Profiling = o.profiling
	}
	if changed("healthz-bind-address") {
		if err := checkBindAddress(o.healthzBindAddress); err != nil {
			fail("healthz-bind-address", o.healthzBindAddress, err)
		}
		s.cfg.HealthzBindAddress = o.healthzBindAddress
	}

	if changed("log-format") || changed("logging-format") {
		s.log.format = logFlags.format
	}
	if changed("v") {
		s.log.verbosity = logFlags.verbosity
	}

	errs = append(errs, o.ipvs.apply(fs, s)...)
	errs = append(errs, o.conntrack.apply(fs, s)...)
	errs = append(errs, o.userspace.apply(fs, s)...)
	errs = append(errs, o.compat.apply(fs, s)...)
	return errs
}

// finish fills what depends on the merged result and checks what involves
// more than one setting.
func (s *settings) finish(hostname func() (string, error)) []error {
	var errs []error

	// Upstream lower-cases and trims the node name whether it came from the
	// host or from --hostname-override, so Node names match.
	name := s.cfg.HostnameOverride
	if strings.TrimSpace(name) == "" {
		h, err := hostname()
		if err != nil {
			errs = append(errs, fmt.Errorf("cannot tell this node's name (%w); set --hostname-override", err))
		}
		name = h
	}
	s.cfg.HostnameOverride = strings.ToLower(strings.TrimSpace(name))
	if s.cfg.HostnameOverride == "" && len(errs) == 0 {
		errs = append(errs, errors.New("this node's host name is empty; set --hostname-override"))
	}

	// Upstream's nftables mode answers NodePorts only on the node's primary
	// IPs unless given CIDRs; its iptables mode answers on every local IP
	// (and warns that this default is unsafe), and so does kp's: a drop-in
	// keeps the mode's semantics. --nodeport-addresses primary gives the
	// nftables default in iptables mode.
	if len(s.cfg.NodePortAddresses) == 0 && s.cfg.Mode == proxy.ModeNFTables {
		s.cfg.NodePortPrimary = true
	}

	if s.bindAddressV6 {
		if s.cfg.MetricsBindAddress == defaultMetricsBindAddress {
			s.cfg.MetricsBindAddress = defaultMetricsBindAddressV6
		}
		if s.cfg.HealthzBindAddress == defaultHealthzBindAddress {
			s.cfg.HealthzBindAddress = defaultHealthzBindAddressV6
		}
	}

	if s.cfg.MinSyncPeriod > s.cfg.SyncPeriod {
		errs = append(errs, fmt.Errorf("--min-sync-period %s is longer than --sync-period %s", s.cfg.MinSyncPeriod, s.cfg.SyncPeriod))
	}
	if err := s.log.validate(); err != nil {
		errs = append(errs, err)
	}
	if dir := s.cfg.ManifestsDir; dir != "" {
		if fi, err := os.Stat(dir); err != nil {
			errs = append(errs, fmt.Errorf("--manifests %q: %w", dir, err))
		} else if !fi.IsDir() {
			errs = append(errs, fmt.Errorf("--manifests %q: not a directory", dir))
		}
	}
	return errs
}

// parseClusterCIDRs parses upstream's --cluster-cidr: one CIDR, or a
// comma-separated pair of one IPv4 and one IPv6 CIDR.
func parseClusterCIDRs(s string) ([]netip.Prefix, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	items := strings.Split(s, ",")
	cidrs, err := parseCIDRs(items)
	if err != nil {
		return nil, err
	}
	if len(cidrs) > 2 || (len(cidrs) == 2 && cidrs[0].Addr().Is4() == cidrs[1].Addr().Is4()) {
		return nil, errors.New("want one CIDR, or one IPv4 and one IPv6 CIDR for dual-stack")
	}
	return cidrs, nil
}

// parseServiceCIDRs parses --service-cidrs: any number of CIDRs of either
// family. A CIDR covering a whole family (0.0.0.0/0) would drop traffic to
// every address that is not a Service, so it is refused.
func parseServiceCIDRs(s string) ([]netip.Prefix, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	cidrs, err := parseCIDRs(strings.Split(s, ","))
	if err != nil {
		return nil, err
	}
	for _, p := range cidrs {
		if p.Bits() == 0 {
			return nil, fmt.Errorf("%s covers every address; give the Service CIDRs only", p)
		}
	}
	return cidrs, nil
}

// parseNodePortAddresses parses upstream's --nodeport-addresses: CIDRs, or
// the word "primary" alone.
func parseNodePortAddresses(items []string) (cidrs []netip.Prefix, primary bool, err error) {
	var rest []string
	for _, it := range items {
		switch strings.TrimSpace(it) {
		case "":
		case "primary":
			primary = true
		default:
			rest = append(rest, it)
		}
	}
	if primary && len(rest) > 0 {
		return nil, false, errors.New("'primary' cannot be combined with CIDRs")
	}
	cidrs, err = parseCIDRs(rest)
	return cidrs, primary, err
}

func parseCIDRs(items []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, it := range items {
		it = strings.TrimSpace(it)
		p, err := netip.ParsePrefix(it)
		if err != nil {
			if len(items) == 1 {
				return nil, errors.New("invalid CIDR")
			}
			return nil, fmt.Errorf("invalid CIDR %q", it)
		}
		// Upstream accepts host bits (10.0.0.1/8) and means the network.
		out = append(out, p.Masked())
	}
	return out, nil
}

func checkMasqueradeBit(bit int32) error {
	if bit < 0 || bit > 31 {
		return errors.New("must be within [0, 31]")
	}
	return nil
}

func checkDuration(d time.Duration, zeroOK bool) error {
	switch {
	case d < 0:
		return errors.New("must not be negative")
	case d == 0 && !zeroOK:
		return errors.New("must be greater than 0")
	}
	return nil
}

// checkBindAddress accepts "IP:port", ":port", or "" (server disabled), as
// upstream does.
func checkBindAddress(s string) error {
	if s == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return errors.New("want IP:port, for example 0.0.0.0:10256")
	}
	if host != "" {
		if _, err := netip.ParseAddr(host); err != nil {
			return fmt.Errorf("%q is not an IP address", host)
		}
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("%q is not a port number", port)
	}
	return nil
}
