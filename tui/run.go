package tui

import (
	"context"
	"errors"

	tea "charm.land/bubbletea/v2"
)

// Run runs kp top on the terminal until the user quits or ctx is done.
func Run(ctx context.Context, cfg Config, opts ...tea.ProgramOption) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if cfg.Events == nil && cfg.Source != nil {
		ch := make(chan tea.Msg)
		go streamFlows(ctx, cfg.Source, ch, max(cfg.Refresh, minRetry))
		cfg.Events = ch
	}
	p := tea.NewProgram(New(cfg), append([]tea.ProgramOption{tea.WithContext(ctx)}, opts...)...)
	_, err := p.Run()
	if errors.Is(err, tea.ErrProgramKilled) && ctx.Err() != nil {
		// Interrupted from outside (SIGTERM): not a failure.
		return nil
	}
	return err
}
