package main

import (
	"context"
	"fmt"

	"github.com/kpproxy/kp/cmd/kp/options"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// startBackend builds and probes the backend of s's mode. When the mode is
// auto (s.Auto) it tries every mode in fallback order and starts
// the first whose probe passes, with the settings of that mode; the choice
// and the reason each earlier mode was refused are logged and returned for
// the status API. A forced mode that fails its probe is an error naming
// the reason.
func (a *app) startBackend(ctx context.Context, s options.Settings) (options.Settings, proxy.Backend, *statusapi.ModeChoice, error) {
	if !s.Auto {
		b, err := a.probeMode(ctx, s)
		if err != nil {
			return s, nil, nil, err
		}
		return s, b, &statusapi.ModeChoice{From: s.ModeFrom}, nil
	}
	chosen := s
	b, refused, err := proxy.FirstThatRuns(ctx, options.Modes, func(m proxy.Mode) (proxy.Backend, error) {
		sm, err := s.ForMode(m)
		if err != nil {
			return nil, err
		}
		chosen = sm
		return a.buildMode(sm)
	})
	choice := &statusapi.ModeChoice{From: "auto", Auto: true}
	for _, r := range refused {
		a.log.Info("proxy mode refused", "mode", r.Mode, "reason", r.Reason)
		choice.Refused = append(choice.Refused, statusapi.RefusedMode{Mode: string(r.Mode), Reason: r.Reason.Error()})
	}
	if err != nil {
		return s, nil, choice, err
	}
	a.log.Info("proxy mode chosen", "mode", b.Mode(), "refused", len(choice.Refused))
	return chosen, b, choice, nil
}

// probeMode builds the backend of s's mode and probes it.
func (a *app) probeMode(ctx context.Context, s options.Settings) (proxy.Backend, error) {
	backend, err := a.buildMode(s)
	if err != nil {
		return nil, err
	}
	if err := proxy.Probe(ctx, backend); err != nil {
		return nil, err
	}
	return backend, nil
}

// buildMode builds the backend of s's mode: the one constructor path of
// every backend kp runs, at start and after a switch.
func (a *app) buildMode(s options.Settings) (proxy.Backend, error) {
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
	return backend, nil
}

// warnDefaultMode warns, once at start, when no mode was set and kp runs
// another mode than kube-proxy would: upstream's empty mode is iptables,
// kp's is the first mode this node runs (nftables first). It names what an
// operator of a kube-proxy cluster would notice.
func (a *app) warnDefaultMode(s options.Settings) {
	cfg := s.Config
	if !s.ModeUnset || cfg.Mode == proxy.ModeIPTables {
		return
	}
	nodePorts := "answers NodePorts on every local IP (and 127.0.0.1, localhostNodePorts)"
	ours := "answers NodePorts on the addresses nodePortAddresses lists, as kube-proxy would"
	switch {
	case len(cfg.NodePortAddresses) > 0:
		nodePorts = ours
	case cfg.NodePortPrimary:
		ours = "answers NodePorts on the node's primary IPs only (nodePortAddresses unset: nftables mode's default)"
	default:
		ours = "answers NodePorts on every local IP, but not on 127.0.0.1"
	}
	a.log.Warn("no proxy mode set (mode: \"\" in the config file, no --proxy-mode): kube-proxy runs iptables mode then, kp runs the first mode this node supports",
		"mode", cfg.Mode, "kube-proxy", "iptables mode: KUBE-* iptables chains; "+nodePorts,
		"kp", string(cfg.Mode)+" mode: "+ours,
		"fix", "set mode (or --proxy-mode) to the mode you want: iptables keeps kube-proxy's behaviour")
}
