package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/pflag"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// startBackend builds and probes the backend of s's mode. When the mode is
// auto (s.forMode is set) it tries every mode in fallback order and starts
// the first whose probe passes, with the settings of that mode; the choice
// and the reason each earlier mode was refused are logged and returned for
// the status API. A forced mode that fails its probe is an error naming
// the reason.
func (a *app) startBackend(ctx context.Context, s settings) (settings, proxy.Backend, *statusapi.ModeChoice, error) {
	if s.forMode == nil {
		b, err := a.probeMode(ctx, s)
		if err != nil {
			return s, nil, nil, err
		}
		return s, b, &statusapi.ModeChoice{From: s.modeFrom}, nil
	}
	choice := &statusapi.ModeChoice{From: "auto", Auto: true}
	var errs []error
	for _, m := range modes {
		sm, err := s.forMode(m)
		if err == nil {
			var b proxy.Backend
			if b, err = a.probeMode(ctx, sm); err == nil {
				a.log.Info("proxy mode chosen", "mode", m, "refused", len(choice.Refused))
				return sm, b, choice, nil
			}
		}
		a.log.Info("proxy mode refused", "mode", m, "reason", err)
		choice.Refused = append(choice.Refused, statusapi.RefusedMode{Mode: string(m), Reason: err.Error()})
		errs = append(errs, err)
	}
	return s, nil, choice, fmt.Errorf("no proxy mode can run on this node:\n%w", errors.Join(errs...))
}

// probeMode builds the backend of s's mode and probes it.
func (a *app) probeMode(ctx context.Context, s settings) (proxy.Backend, error) {
	cfg := s.cfg
	newBackend, ok := a.backends[cfg.Mode]
	if !ok {
		if s.modeFrom == "auto" { // a candidate of auto
			return nil, fmt.Errorf("%s mode is not built into this kp", cfg.Mode)
		}
		return nil, fmt.Errorf("%s is not implemented yet; use %s", s.modeFrom, proxy.ModeNFTables)
	}
	backend, err := newBackend(cfg, a.log)
	if err != nil {
		return nil, fmt.Errorf("%s mode: %w", cfg.Mode, err)
	}
	if err := backend.Probe(ctx); err != nil {
		return nil, fmt.Errorf("%s mode cannot run on this node: %w", cfg.Mode, err)
	}
	return backend, nil
}

// resolveMode sets s's mode from, first to last: a mode auto is trying
// (forcedMode), --proxy-mode, the config file's mode. None of them, or
// "auto", leaves the mode auto: resolved as the first candidate, with
// s.forMode to resolve the others. The mode decides which section of the
// file applies, so it is resolved before anything else.
func (o *proxyOptions) resolveMode(fs *pflag.FlagSet, file *fileConfig, s *settings, logFlags logOptions, hostname func() (string, error)) error {
	auto := true
	switch {
	case o.forcedMode != "":
		s.cfg.Mode, s.modeFrom, auto = o.forcedMode, "auto", false
	case fs.Changed("proxy-mode"):
		m, err := parseMode(o.mode)
		if err != nil {
			return fmt.Errorf("--proxy-mode %q: %w", o.mode, err)
		}
		if m != modeAuto {
			s.cfg.Mode, s.modeFrom, auto = m, "--proxy-mode="+o.mode, false
		}
	case file != nil && file.kc.Mode != "":
		m, err := parseMode(string(file.kc.Mode))
		if err != nil {
			return fmt.Errorf("--config %s: mode %q: %w", file.path, file.kc.Mode, err)
		}
		if m != modeAuto {
			s.cfg.Mode, s.modeFrom, auto = m, fmt.Sprintf("mode %s in --config %s", m, file.path), false
		}
	}
	if auto {
		// Resolved as the first candidate; startBackend resolves each
		// candidate it tries again through forMode.
		s.cfg.Mode, s.modeFrom = modes[0], "auto"
		s.forMode = func(m proxy.Mode) (settings, error) {
			forced := *o
			forced.forcedMode = m
			return forced.settings(fs, logFlags, hostname)
		}
	}
	return nil
}

// modes lists every mode kp recognises, in fallback order.
var modes = []proxy.Mode{proxy.ModeNFTables, proxy.ModeIPTables, proxy.ModeIPVS, proxy.ModeUserspace}

// modeAuto is --proxy-mode auto (or empty): the first mode of modes whose
// probe passes.
const modeAuto proxy.Mode = "auto"

func parseMode(s string) (proxy.Mode, error) {
	if s == "" || s == string(modeAuto) {
		return modeAuto, nil
	}
	m := proxy.Mode(s)
	if !slices.Contains(modes, m) {
		names := make([]string, len(modes))
		for i, m := range modes {
			names[i] = string(m)
		}
		return "", fmt.Errorf("unknown proxy mode; valid modes are %s, or auto", strings.Join(names, ", "))
	}
	return m, nil
}
