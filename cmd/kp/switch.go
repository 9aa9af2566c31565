package main

import (
	"context"

	"github.com/kpproxy/kp/cmd/kp/options"
	"github.com/kpproxy/kp/conntrack"
	"github.com/kpproxy/kp/migrate"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// switcher wraps the started backend in the migrate.Switcher kp proxy runs:
// it builds other modes' backends with s's settings for that mode, removes
// everything but the running mode's rules after the first sync and after
// each switch (migrate.TakeOver), and keeps the conntrack cleaner in step
// with the mode.
func (a *app) switcher(s options.Settings, backend proxy.Backend, observers []proxy.SyncObserver) *migrate.Switcher {
	var cleaner *conntrack.Cleaner
	for _, o := range observers {
		if c, ok := o.(*conntrack.Cleaner); ok {
			cleaner = c
		}
	}
	cfg := s.Config
	return migrate.NewSwitcher(migrate.SwitcherConfig{
		Initial:       backend,
		InitialTarget: proxy.TargetOf(backend),
		AllowModeNone: cfg.AllowModeNone,
		Log:           a.log,
		Build: func(ctx context.Context, t proxy.Target) (proxy.Backend, proxy.Target, error) {
			st, err := a.settingsFor(s, t)
			if err != nil {
				return nil, t, err
			}
			b, err := a.probeMode(ctx, st)
			if err != nil {
				return nil, t, err
			}
			// As at start: the target's sysctls set, or each wrong one
			// warned about, before it programs anything.
			a.modeSysctls(b)
			return b, proxy.TargetOf(b), nil
		},
		Retire: func(ctx context.Context, running proxy.Target, st *proxy.State, keepActive bool) (int, error) {
			to := &migrate.TakeOver{Mode: running.Mode, Log: a.log, NodePorts: migrate.NodePortsOf(st), KeepActive: keepActive,
				Others: map[proxy.Mode]func(context.Context, bool) (int, error){}}
			for m := range a.backends {
				to.Others[m] = func(ctx context.Context, keepActive bool) (int, error) {
					return a.cleanupModeKeeping(ctx, m, cfg, keepActive)
				}
			}
			return to.Run(ctx)
		},
		// The none mode carries nothing: there is nothing to prove. The
		// others are proven on the NodePort addresses their own settings
		// name.
		Verify: func(ctx context.Context, st *proxy.State, b proxy.Backend) (*statusapi.Verification, error) {
			if b.Mode() == proxy.ModeNone {
				return &statusapi.Verification{}, nil
			}
			bs, err := a.settingsFor(s, proxy.TargetOf(b))
			if err != nil {
				return nil, err
			}
			return migrate.VerifyServices(ctx, st, b, migrate.VerifyOptions{NodePorts: migrate.NodePortScope{
				CIDRs: bs.Config.NodePortAddresses, Primary: bs.Config.NodePortPrimary}})
		},
		Switched: func(old, b proxy.Backend) {
			if cleaner != nil {
				cleaner.SetKeepRedirected(b.Mode() == proxy.ModeUserspace)
				// A userspace mode that drains hands its UDP flows over
				// itself (legacy/userspace/handover.go).
				sp, _ := old.(conntrack.Spared)
				cleaner.Spare(sp)
			}
		},
	})
}

// settingsFor is s for target t (options.Settings.ForTarget, the one
// resolution of a target's settings, which kp migrate cluster's preflight
// reads too): the settings a kp started in t's mode with the same flags and
// config file has (the mode's own section of the file and its own
// defaults, such as where NodePorts answer), with t's iptables flavor.
func (a *app) settingsFor(s options.Settings, t proxy.Target) (options.Settings, error) {
	return s.ForTarget(t)
}
