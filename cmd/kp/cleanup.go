package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kpproxy/kp/cmd/kp/options"
	"github.com/kpproxy/kp/proxy"
)

func newCleanupCommand(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "cleanup",
		Short: "Remove everything kp wrote to this node's kernel",
		Long: `Remove everything any kp mode wrote to this node's kernel (for nftables, kp's own
tables), touching nothing else, then exit. It succeeds when there is nothing to
remove. Run it after uninstalling kp, or before switching the node to another proxy.
'kp proxy --cleanup' does the same, as kube-proxy --cleanup does.`,
		Example: `  # On the node, as root
  kp cleanup

  # In a network namespace where kp ran
  ip netns exec node-1 kp cleanup -v 2`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s := options.DefaultSettings()
			return a.cleanup(cmd.Context(), s.Config)
		},
	}
}

// cleanup runs every built mode's Cleanup, whatever mode cfg names: a node
// switching modes must not keep the old mode's rules.
func (a *app) cleanup(ctx context.Context, cfg proxy.Config) error {
	var errs []error
	var cleaned []proxy.Mode
	for _, m := range options.Modes {
		if _, ok := a.backends[m]; !ok {
			continue
		}
		if err := a.cleanupMode(ctx, m, cfg); err != nil {
			errs = append(errs, fmt.Errorf("cleanup %s mode: %w", m, err))
			continue
		}
		cleaned = append(cleaned, m)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	a.log.Info("cleanup finished", "modes", cleaned)
	return nil
}

// cleanupMode removes what mode m (a built one) ever wrote.
func (a *app) cleanupMode(ctx context.Context, m proxy.Mode, cfg proxy.Config) error {
	_, err := a.cleanupModeKeeping(ctx, m, cfg, false)
	return err
}

// cleanupModeKeeping is cleanupMode after a switch: with keepActive, a mode
// whose state carries established connections (ipvs) keeps that part and
// returns how much it kept.
func (a *app) cleanupModeKeeping(ctx context.Context, m proxy.Mode, cfg proxy.Config, keepActive bool) (int, error) {
	b, err := a.backends[m](cfg, a.log)
	if err != nil {
		return 0, err
	}
	if k, ok := b.(proxy.ActiveKeepingCleaner); ok && keepActive {
		return k.CleanupKeepingActive(ctx)
	}
	return 0, b.Cleanup(ctx)
}
