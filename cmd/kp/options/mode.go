package options

import (
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/pflag"

	"github.com/kpproxy/kp/proxy"
)

// resolveMode sets s's mode from, first to last: a mode auto is trying or
// a switch programs (forcedMode), --proxy-mode, the config file's mode.
// None of them, or "auto", leaves the mode auto: resolved as the first
// candidate. s.ForMode resolves any other mode from the same flags and
// file. The mode decides which section of the file applies, so it is
// resolved before anything else.
func (o *Options) resolveMode(fs *pflag.FlagSet, changed func(string) bool, file *fileConfig, s *Settings, logFlags LogOptions, hostname func() (string, error)) error {
	auto := true
	s.ModeUnset = (!changed("proxy-mode") || o.mode == "") && (file == nil || file.kc.Mode == "")
	switch {
	case o.forcedMode != "":
		s.Config.Mode, s.ModeFrom, auto = o.forcedMode, "auto", false
	case changed("proxy-mode"):
		m, err := parseMode(o.mode)
		if err != nil {
			return fmt.Errorf("--proxy-mode %q: %w", o.mode, err)
		}
		if m != modeAuto {
			s.Config.Mode, s.ModeFrom, auto = m, "--proxy-mode="+o.mode, false
		}
	case file != nil && file.kc.Mode != "":
		m, err := parseMode(string(file.kc.Mode))
		if err != nil {
			return fmt.Errorf("--config %s: mode %q: %w", file.path, file.kc.Mode, err)
		}
		if m != modeAuto {
			s.Config.Mode, s.ModeFrom, auto = m, fmt.Sprintf("mode %s in --config %s", m, file.path), false
		}
	}
	if auto {
		// Resolved as the first candidate; startBackend resolves each
		// candidate it tries again through ForMode.
		s.Config.Mode, s.ModeFrom, s.Auto = Modes[0], "auto", true
	}
	s.ForMode = func(m proxy.Mode) (Settings, error) {
		forced := *o
		forced.forcedMode = m
		return forced.resolveWith(fs, file, logFlags, hostname)
	}
	return nil
}

// Modes lists every mode kp recognises, in fallback order.
var Modes = []proxy.Mode{proxy.ModeNFTables, proxy.ModeIPTables, proxy.ModeIPVS, proxy.ModeUserspace}

// modeAuto is --proxy-mode auto (or empty): the first mode of Modes whose
// probe passes.
const modeAuto proxy.Mode = "auto"

func parseMode(s string) (proxy.Mode, error) {
	if s == "" || s == string(modeAuto) {
		return modeAuto, nil
	}
	m := proxy.Mode(s)
	if !slices.Contains(Modes, m) {
		names := make([]string, len(Modes))
		for i, m := range Modes {
			names[i] = string(m)
		}
		return "", fmt.Errorf("unknown proxy mode; valid modes are %s, or auto", strings.Join(names, ", "))
	}
	return m, nil
}
