package options

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/kpproxy/kp/proxy"
)

// SettingsFromConfig is what kp makes of kc once it serves as target: kp
// proxy --config with kc and no flag (the mode kc names, or auto), then
// target's settings as a switch to it builds them (ForTarget). It is how
// kp migrate cluster's preflight knows what kp will do, through the same
// merge as kp proxy. source names kc in errors (a ConfigMap and its key).
// lenient is what DecodeKubeProxyConfiguration warned of, kept among the
// settings' Ignored as kp proxy logs it.
func SettingsFromConfig(kc *KubeProxyConfiguration, lenient []IgnoredSetting, source string, target proxy.Target) (Settings, error) {
	o := &Options{loaded: &fileConfig{path: source, kc: *kc, lenient: lenient}}
	fs := pflag.NewFlagSet("kp proxy", pflag.ContinueOnError)
	o.AddFlags(fs)
	s, err := o.Resolve(fs, DefaultLogOptions(), func() (string, error) { return "preflight", nil })
	if err != nil {
		return s, err
	}
	return s.ForTarget(target)
}

// ForTarget is s for target t, as a switch to t (and a start in t's mode
// through the Node's annotation) builds it: t's own resolution from the
// same flags and file (ForMode: its section of the config file, its
// defaults), with t's iptables flavor. Settings not resolved from flags
// (tests) only have the mode and flavor replaced.
func (s Settings) ForTarget(t proxy.Target) (Settings, error) {
	out := s
	if s.ForMode != nil {
		var err error
		if out, err = s.ForMode(t.Mode); err != nil {
			return s, fmt.Errorf("settings for %s mode: %w", t.Mode, err)
		}
	}
	out.Config.Mode, out.ModeFrom = t.Mode, "kp migrate --to "+t.String()
	if t.IPTablesBackend != "" {
		out.Config.IPTablesBackend = t.IPTablesBackend
	}
	return out, nil
}
