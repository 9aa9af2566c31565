package options

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/spf13/pflag"

	"github.com/kpproxy/kp/proxy"
)

// kube-proxy settings kp accepts so a DaemonSet's arguments work unchanged.
// A setting that only tunes the node or the process is accepted and logged as
// ignored; one that would change how Services behave, in a way kp does not
// implement, is an error, because silently proxying differently is worse than
// refusing to start.

// ignoredFlags are upstream flags kp accepts and does not act on, with
// upstream's defaults.
var ignoredFlags = []struct {
	name, kind, def, reason string
}{
	{"oom-score-adj", "int32", "-999", "kp does not change its own OOM score; set it through the pod"},
	{"kube-api-qps", "float32", "5", "kp sets its own API client rate limits"},
	{"kube-api-burst", "int32", "10", "kp sets its own API client rate limits"},
	{"kube-api-content-type", "string", "application/vnd.kubernetes.protobuf", "kp chooses the API content type itself"},
	{"show-hidden-metrics-for-version", "string", "", "kp has no hidden metrics"},
	{"bind-address-hard-fail", "bool", "false", "kp always fails when it cannot bind its servers"},
	// cadvisor's, which upstream's binary links and kube-proxy never reads.
	{"boot-id-file", "string", "/proc/sys/kernel/random/boot_id", "kube-proxy does not read it either"},
	{"machine-id-file", "string", "/etc/machine-id,/var/lib/dbus/machine-id", "kube-proxy does not read it either"},
}

// ignoredLogFlags are the logging flags kp checks (LogOptions) and does not
// act on.
var ignoredLogFlags = []struct{ name, reason string }{
	{"vmodule", "kp's logs have one verbosity"},
	{"log-flush-frequency", "kp writes each log line at once"},
	{"log-text-info-buffer-size", "kp does not buffer its logs"},
	{"log-json-info-buffer-size", "kp does not buffer its logs"},
}

// compatOptions holds the upstream flags that kp checks rather than uses.
type compatOptions struct {
	bindAddress       string
	detectLocalMode   string
	bridgeInterface   string
	interfaceNameFrom string
	featureGates      featureGates
}

func (c *compatOptions) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.bindAddress, "bind-address", "",
		"Accepted for kube-proxy compatibility: only 0.0.0.0 or :: (kp takes the node's IPs from its Node object).")
	fs.StringVar(&c.detectLocalMode, "detect-local-mode", "",
		"Mode to use to detect local traffic (from this node's pods): ClusterCIDR (the default: from --cluster-cidr), "+
			"NodeCIDR (from the Node's spec.podCIDRs), BridgeInterface (arriving on --pod-bridge-interface) or "+
			"InterfaceNamePrefix (arriving on an interface named --pod-interface-name-prefix*).")
	fs.StringVar(&c.bridgeInterface, "pod-bridge-interface", "",
		"A bridge interface name. When --detect-local-mode is set to BridgeInterface, kp will consider traffic "+
			"to be local if it originates from this bridge.")
	fs.StringVar(&c.interfaceNameFrom, "pod-interface-name-prefix", "",
		"An interface name prefix. When --detect-local-mode is set to InterfaceNamePrefix, kp will consider traffic "+
			"to be local if it originates from any interface whose name begins with this prefix.")
	c.featureGates = featureGates{}
	fs.Var(&c.featureGates, "feature-gates",
		"A set of key=value pairs that describe feature gates for alpha/experimental features: every gate upstream "+
			"kube-proxy knows is accepted; those that change a proxy are honoured, the others logged as ignored. "+
			"Options are:\n"+gatesHelp())
	for _, f := range ignoredFlags {
		usage := "Ignored by kp: " + f.reason + "."
		switch f.kind {
		case "int32":
			fs.Int32(f.name, 0, usage)
		case "float32":
			fs.Float32(f.name, 0, usage)
		case "bool":
			fs.Bool(f.name, false, usage)
		default:
			fs.String(f.name, "", usage)
		}
		fs.Lookup(f.name).DefValue = f.def
	}
}

// apply checks the compatibility flags in force and records the ignored
// ones in s.
func (c *compatOptions) apply(changed func(string) bool, s *Settings) []error {
	var errs []error
	if changed("bind-address") {
		v6, err := checkBindAddressIP(c.bindAddress)
		if err != nil {
			errs = append(errs, fmt.Errorf("--bind-address %q: %w", c.bindAddress, err))
		}
		s.bindAddressV6 = v6
	}
	d := &s.Config.DetectLocal
	if changed("detect-local-mode") {
		m, err := parseLocalMode(c.detectLocalMode)
		if err != nil {
			errs = append(errs, fmt.Errorf("--detect-local-mode %q: %w", c.detectLocalMode, err))
		}
		d.Mode = m
	}
	if changed("pod-bridge-interface") {
		d.BridgeInterface = c.bridgeInterface
	}
	if changed("pod-interface-name-prefix") {
		d.InterfaceNamePrefix = c.interfaceNameFrom
	}
	if changed("feature-gates") {
		s.featureGates = maps.Clone(c.featureGates)
		s.featureGatesFrom = "--feature-gates"
	}
	for _, f := range ignoredFlags {
		if changed(f.name) {
			s.Ignored = append(s.Ignored, IgnoredSetting{Name: "--" + f.name, Reason: f.reason})
		}
	}
	for _, f := range ignoredLogFlags {
		if changed(f.name) {
			s.Ignored = append(s.Ignored, IgnoredSetting{Name: "--" + f.name, Reason: f.reason})
		}
	}
	return errs
}

// checkBindAddressIP accepts upstream's bind address only when it means "no
// override": kp does not let it replace the node's primary IP.
func checkBindAddressIP(s string) (v6 bool, err error) {
	if s == "" {
		return false, nil
	}
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return false, errors.New("not an IP address")
	}
	if !ip.IsUnspecified() {
		return false, errors.New("kp does not support overriding the node's primary IP; leave it unset, 0.0.0.0 or ::")
	}
	return ip.Is6(), nil
}

// localModes are upstream's detect-local modes, in its order ("" is
// ClusterCIDR).
var localModes = []proxy.LocalMode{proxy.LocalModeClusterCIDR, proxy.LocalModeNodeCIDR,
	proxy.LocalModeBridgeInterface, proxy.LocalModeInterfaceNamePrefix, ""}

// parseLocalMode checks a detect-local mode as upstream's validation does.
func parseLocalMode(s string) (proxy.LocalMode, error) {
	m := proxy.LocalMode(s)
	if slices.Contains(localModes, m) {
		return m, nil
	}
	quoted := make([]string, len(localModes))
	for i, m := range localModes {
		quoted[i] = fmt.Sprintf("%q", m)
	}
	return "", fmt.Errorf("Unsupported value: %q: supported values: %s", s, strings.Join(quoted, ", "))
}

// checkDetectLocal checks that the mode has what it reads (upstream's
// validateDetectLocalConfiguration).
func checkDetectLocal(d proxy.DetectLocal) *settingProblem {
	switch {
	case d.Mode == proxy.LocalModeBridgeInterface && d.BridgeInterface == "":
		return &settingProblem{"detectLocal.bridgeInterface", "pod-bridge-interface",
			`Invalid value: "": must not be empty with detectLocalMode BridgeInterface`}
	case d.Mode == proxy.LocalModeInterfaceNamePrefix && d.InterfaceNamePrefix == "":
		return &settingProblem{"detectLocal.interfaceNamePrefix", "pod-interface-name-prefix",
			`Invalid value: "": must not be empty with detectLocalMode InterfaceNamePrefix`}
	}
	return nil
}

// IgnoredFlagsHelp is the paragraph of kp proxy's help naming the ignored flags.
func IgnoredFlagsHelp() string {
	var names []string
	for _, f := range ignoredFlags {
		names = append(names, "--"+f.name)
	}
	for _, f := range ignoredLogFlags {
		names = append(names, "--"+f.name)
	}
	return "Accepted for kube-proxy compatibility and ignored (logged at start): " + strings.Join(names, ", ") + "."
}
