package options

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
)

// kube-proxy settings kp accepts so a DaemonSet's arguments work unchanged.
// A setting that only tunes the node or the process is accepted and logged as
// ignored; one that would change how Services behave, in a way kp does not
// implement, is an error, because silently proxying differently is worse than
// refusing to start.

// ignoredFlags are upstream flags kp accepts and does not act on.
var ignoredFlags = []struct {
	name, kind, reason string
}{
	{"oom-score-adj", "int32", "kp does not change its own OOM score; set it through the pod"},
	{"kube-api-qps", "float32", "kp sets its own API client rate limits"},
	{"kube-api-burst", "int32", "kp sets its own API client rate limits"},
	{"kube-api-content-type", "string", "kp chooses the API content type itself"},
	{"show-hidden-metrics-for-version", "string", "kp has no hidden metrics"},
	{"log-flush-frequency", "duration", "kp does not buffer its logs"},
	{"bind-address-hard-fail", "bool", "kp always fails when it cannot bind its servers"},
}

// supportedFeatureGates are the upstream feature gates kp accepts, each with
// the only value kp honours. A gate outside this list is an error: kp cannot
// tell what turning it on or off would have meant.
var supportedFeatureGates = map[string]bool{
	"AllAlpha":          false,
	"AllBeta":           false,
	"NFTablesProxyMode": true,
}

// compatOptions holds the upstream flags that kp checks rather than uses.
type compatOptions struct {
	bindAddress     string
	detectLocalMode string
	featureGates    featureGates
}

func (c *compatOptions) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.bindAddress, "bind-address", "",
		"Accepted for kube-proxy compatibility: only 0.0.0.0 or :: (kp takes the node's IPs from its Node object).")
	fs.StringVar(&c.detectLocalMode, "detect-local-mode", "",
		"Accepted for kube-proxy compatibility: only ClusterCIDR (local traffic is traffic from --cluster-cidr).")
	c.featureGates = featureGates{}
	fs.Var(&c.featureGates, "feature-gates",
		"Accepted for kube-proxy compatibility: Name=true|false pairs; kp accepts only "+supportedGatesList()+".")
	// Hidden from --help to keep it about what kp does; the command's long
	// help lists them (ignoredFlagsHelp).
	for _, f := range ignoredFlags {
		usage := "Ignored by kp: " + f.reason + "."
		switch f.kind {
		case "int32":
			fs.Int32(f.name, 0, usage)
		case "float32":
			fs.Float32(f.name, 0, usage)
		case "bool":
			fs.Bool(f.name, false, usage)
		case "duration":
			fs.Duration(f.name, 0, usage)
		default:
			fs.String(f.name, "", usage)
		}
		_ = fs.MarkHidden(f.name)
	}
}

// apply checks the compatibility flags set on the command line and records
// the ignored ones in s.
func (c *compatOptions) apply(fs *pflag.FlagSet, s *Settings) []error {
	var errs []error
	if fs.Changed("bind-address") {
		v6, err := checkBindAddressIP(c.bindAddress)
		if err != nil {
			errs = append(errs, fmt.Errorf("--bind-address %q: %w", c.bindAddress, err))
		}
		s.bindAddressV6 = v6
	}
	if fs.Changed("detect-local-mode") {
		if err := checkDetectLocalMode(c.detectLocalMode); err != nil {
			errs = append(errs, fmt.Errorf("--detect-local-mode %q: %w", c.detectLocalMode, err))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.featureGates)) {
		if err := checkFeatureGate(name, c.featureGates[name]); err != nil {
			errs = append(errs, fmt.Errorf("--feature-gates %s=%t: %w", name, c.featureGates[name], err))
		}
	}
	for _, f := range ignoredFlags {
		if fs.Changed(f.name) {
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

func checkDetectLocalMode(s string) error {
	if s == "" || s == "ClusterCIDR" {
		return nil
	}
	switch s {
	case "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix":
		return errors.New("not supported by kp; only ClusterCIDR (with --cluster-cidr) is")
	}
	return errors.New("unknown mode; kp supports ClusterCIDR")
}

func checkFeatureGate(name string, value bool) error {
	want, ok := supportedFeatureGates[name]
	if !ok {
		return errors.New("not supported by kp")
	}
	if value != want {
		return fmt.Errorf("not supported by kp, which always behaves as %s=%t", name, want)
	}
	return nil
}

// IgnoredFlagsHelp is the paragraph of kp proxy's help naming the ignored flags.
func IgnoredFlagsHelp() string {
	names := make([]string, len(ignoredFlags))
	for i, f := range ignoredFlags {
		names[i] = "--" + f.name
	}
	return "Accepted for kube-proxy compatibility and ignored (logged at start): " + strings.Join(names, ", ") + "."
}

func supportedGatesList() string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(supportedFeatureGates)) {
		out = append(out, fmt.Sprintf("%s=%t", name, supportedFeatureGates[name]))
	}
	return strings.Join(out, ", ")
}

// featureGates is upstream's --feature-gates value: comma-separated
// Name=true|false pairs, the flag repeatable.
type featureGates map[string]bool

func (f featureGates) String() string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(f)) {
		out = append(out, fmt.Sprintf("%s=%t", name, f[name]))
	}
	return strings.Join(out, ",")
}

func (f featureGates) Set(s string) error {
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, val, ok := strings.Cut(item, "=")
		if !ok {
			return fmt.Errorf("%q: want Name=true|false", item)
		}
		b, err := strconv.ParseBool(strings.TrimSpace(val))
		if err != nil {
			return fmt.Errorf("%q: want Name=true|false", item)
		}
		f[strings.TrimSpace(name)] = b
	}
	return nil
}

func (f featureGates) Type() string { return "mapStringBool" }
