package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/kpproxy/kp/cmd/kp/options"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// startBackend builds and probes the backend of s's mode. When the mode is
// auto (s.ForMode is set) it tries every mode in fallback order and starts
// the first whose probe passes, with the settings of that mode; the choice
// and the reason each earlier mode was refused are logged and returned for
// the status API. A forced mode that fails its probe is an error naming
// the reason.
func (a *app) startBackend(ctx context.Context, s options.Settings) (options.Settings, proxy.Backend, *statusapi.ModeChoice, error) {
	if s.ForMode == nil {
		b, err := a.probeMode(ctx, s)
		if err != nil {
			return s, nil, nil, err
		}
		return s, b, &statusapi.ModeChoice{From: s.ModeFrom}, nil
	}
	choice := &statusapi.ModeChoice{From: "auto", Auto: true}
	var errs []error
	for _, m := range options.Modes {
		sm, err := s.ForMode(m)
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
func (a *app) probeMode(ctx context.Context, s options.Settings) (proxy.Backend, error) {
	cfg := s.Config
	newBackend, ok := a.backends[cfg.Mode]
	if !ok {
		if s.ModeFrom == "auto" { // a candidate of auto
			return nil, fmt.Errorf("%s mode is not built into this kp", cfg.Mode)
		}
		return nil, fmt.Errorf("%s is not implemented yet; use %s", s.ModeFrom, proxy.ModeNFTables)
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
