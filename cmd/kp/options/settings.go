package options

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/kpproxy/kp/conntrack"
	"github.com/kpproxy/kp/legacy/iptables"
	"github.com/kpproxy/kp/legacy/userspace"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/server"
)

// Settings is everything kp proxy resolved from flags and the config file.
type Settings struct {
	Config proxy.Config
	// Conntrack is what kp sets in the node's conntrack at start.
	Conntrack conntrack.Tuning
	Log       LogOptions
	// ModeFrom says where the mode came from, for "not implemented" errors.
	ModeFrom string
	// Auto: no mode was asked for; the mode is the first candidate, and
	// ForMode resolves the others.
	Auto bool
	// ForMode is the settings again with the mode forced to m, resolved
	// from the same flags and config file as these: each mode reads its
	// own section of the file and has its own defaults (NodePorts on the
	// primary IPs in nftables mode, on every local address in the
	// others). cmd/kp builds every backend from it, whether auto tries
	// the mode at start or a switch programs it (startBackend,
	// settingsFor), so both get the same settings.
	ForMode func(m proxy.Mode) (Settings, error)
	// nameGiven: the node's name came from --hostname-override or the
	// file, not the host.
	nameGiven bool
	// bindAddressV6 is an IPv6 unspecified --bind-address, which moves the
	// default server addresses to IPv6 as upstream does.
	bindAddressV6 bool
	// Ignored lists settings kp accepts for compatibility but does not act on;
	// they are logged once the logger is final.
	Ignored []IgnoredSetting
	// ConfigFile is --config's path, ConfigFileData the content read: kp
	// exits when it changes, as upstream.
	ConfigFile     string
	ConfigFileData []byte
	// ModeUnset is true when neither --proxy-mode nor the file's mode named
	// a mode: upstream then runs iptables, kp the first mode that runs
	// (cmd/kp warns when that differs).
	ModeUnset bool
	// featureGates are the gates set (by the file with --config, else by
	// --feature-gates), gates their checked state.
	featureGates     map[string]bool
	featureGatesFrom string
	gates            featureGateSet
}

// IgnoredSetting is a setting kp accepts and does not act on.
type IgnoredSetting struct {
	Name   string // "--conntrack-max-per-core" or "conntrack.maxPerCore in kube-proxy.yaml"
	Reason string
	// Warn: logged as a warning, since upstream would not have ignored it
	// silently either or it was likely meant to act (a flag beside --config).
	Warn bool
}

// GateEnabled reports whether an upstream feature gate is on.
func (s Settings) GateEnabled(name string) bool { return s.gates.enabled(name) }

// DefaultSettings are upstream kube-proxy's defaults, with nftables as the
// mode.
func DefaultSettings() Settings {
	return Settings{
		Config: proxy.Config{
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
			DriftCheckPeriod:        proxy.DefaultDriftCheckPeriod,
			MetricsBindAddress:      defaultMetricsBindAddress,
			HealthzBindAddress:      defaultHealthzBindAddress,
			StatusSocket:            server.DefaultStatusSocket,
		},
		Conntrack: conntrack.DefaultTuning(),
		Log:       DefaultLogOptions(),
	}
}

// Resolve merges defaults, then either the --config file or the flags, as
// upstream does: with --config, only the flags without a field in the file
// (and --hostname-override and the logging flags, which beat it) are in
// force; the others set on the command line are ignored, each logged as a
// warning (see flagsInForce). fs is the parsed command's flag set,
// including the root's logging flags, whose values are logFlags.
func (o *Options) Resolve(fs *pflag.FlagSet, logFlags LogOptions, hostname func() (string, error)) (Settings, error) {
	file := o.loaded
	if file == nil && o.configFile != "" {
		f, err := loadConfigFile(o.configFile)
		if err != nil {
			return DefaultSettings(), err
		}
		file = f
	}
	return o.resolveWith(fs, file, logFlags, hostname)
}

// resolveWith is Resolve with the config file already read (ForMode
// resolves every other mode from the file as it was read at start, not as
// a switch later finds it).
func (o *Options) resolveWith(fs *pflag.FlagSet, file *fileConfig, logFlags LogOptions, hostname func() (string, error)) (Settings, error) {
	s := DefaultSettings()
	if file != nil {
		if file.data != nil { // read from disk, not given (SettingsFromConfig)
			s.ConfigFile, s.ConfigFileData = file.path, file.data
		}
		s.Ignored = append(s.Ignored, file.lenient...)
	}
	changed := o.flagsInForce(fs, file != nil, &s)
	// The mode decides which section of the file applies (nftables.*,
	// iptables.*), so it is resolved first.
	if err := o.resolveMode(fs, changed, file, &s, logFlags, hostname); err != nil {
		return s, err
	}

	var errs []error
	if file != nil {
		errs = append(errs, file.apply(&s)...)
	}
	errs = append(errs, o.apply(changed, logFlags, &s)...)
	if len(errs) == 0 {
		errs = append(errs, s.finish(hostname)...)
	}
	return s, errors.Join(errs...)
}

// finish fills what depends on the merged result and checks what involves
// more than one setting.
func (s *Settings) finish(hostname func() (string, error)) []error {
	var errs []error

	// Upstream lower-cases and trims the node name whether it came from the
	// host or from --hostname-override, so Node names match.
	name := s.Config.HostnameOverride
	s.nameGiven = strings.TrimSpace(name) != ""
	if !s.nameGiven {
		h, err := hostname()
		if err != nil {
			errs = append(errs, fmt.Errorf("cannot tell this node's name (%w); set --hostname-override", err))
		}
		name = h
	}
	s.Config.HostnameOverride = strings.ToLower(strings.TrimSpace(name))
	if s.Config.HostnameOverride == "" && len(errs) == 0 {
		errs = append(errs, errors.New("this node's host name is empty; set --hostname-override"))
	}

	// Upstream's nftables mode answers NodePorts only on the node's primary
	// IPs unless given CIDRs; its iptables mode answers on every local IP
	// (and warns that this default is unsafe), and so does kp's: a drop-in
	// keeps the mode's semantics. --nodeport-addresses primary gives the
	// nftables default in iptables mode.
	if len(s.Config.NodePortAddresses) == 0 && s.Config.Mode == proxy.ModeNFTables {
		s.Config.NodePortPrimary = true
	}

	if s.bindAddressV6 {
		if s.Config.MetricsBindAddress == defaultMetricsBindAddress {
			s.Config.MetricsBindAddress = defaultMetricsBindAddressV6
		}
		if s.Config.HealthzBindAddress == defaultHealthzBindAddress {
			s.Config.HealthzBindAddress = defaultHealthzBindAddressV6
		}
	}

	if s.Config.MinSyncPeriod > s.Config.SyncPeriod {
		errs = append(errs, fmt.Errorf("--min-sync-period %s is longer than --sync-period %s", s.Config.MinSyncPeriod, s.Config.SyncPeriod))
	}
	errs = append(errs, s.finishGates()...)
	if err := s.Log.validate(); err != nil {
		errs = append(errs, err)
	}
	for _, e := range s.Log.validateGated(s.gates.enabled) {
		errs = append(errs, s.settingError(e))
	}
	if e := checkDetectLocal(s.Config.DetectLocal); e != nil {
		errs = append(errs, s.settingError(*e))
	}
	if dir := s.Config.ManifestsDir; dir != "" {
		if fi, err := os.Stat(dir); err != nil {
			errs = append(errs, fmt.Errorf("--manifests %q: %w", dir, err))
		} else if !fi.IsDir() {
			errs = append(errs, fmt.Errorf("--manifests %q: not a directory", dir))
		}
	}
	return errs
}

// finishGates checks the feature gates set, as upstream's SetFromMap does,
// acts on the ones kp honours and lists the rest as ignored.
func (s *Settings) finishGates() []error {
	gates, err := resolveFeatureGates(s.featureGates)
	if err != nil {
		return []error{fmt.Errorf("%s: %w", s.featureGatesFrom, err)}
	}
	s.gates = gates
	s.Config.IgnoreExternalIPs = !gates.enabled("AllowServiceExternalIPs")
	s.Ignored = append(s.Ignored, ignoredGates(s.featureGates)...)
	return nil
}

// settingError names a problem found on the merged settings by where they
// came from: the file's field when there is a file, else the flag.
func (s *Settings) settingError(e settingProblem) error {
	if s.ConfigFile != "" {
		return fmt.Errorf("--config %s: %s: %s", s.ConfigFile, e.field, e.msg)
	}
	return fmt.Errorf("--%s: %s", e.flag, e.msg)
}

// settingProblem is a problem of one setting: its field in the file, its
// flag, and upstream's message.
type settingProblem struct{ field, flag, msg string }
