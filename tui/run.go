package tui

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"syscall"

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
	// The program reads the terminal's size when it starts and listens for
	// SIGWINCH only after its first frame; a resize in between (kubectl
	// exec -it: the runtime applies the client's size just after the
	// process starts) would be lost, its signal ignored, and kp top stay
	// at the size it read, often 0×0. Listening from before the program
	// starts closes that gap: each signal asks it to read the size again.
	resized := make(chan os.Signal, 1)
	signal.Notify(resized, syscall.SIGWINCH)
	defer signal.Stop(resized)
	p := tea.NewProgram(New(cfg), append([]tea.ProgramOption{tea.WithContext(ctx)}, opts...)...)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-resized:
				p.Send(tea.RequestWindowSize())
			}
		}
	}()
	_, err := p.Run()
	if errors.Is(err, tea.ErrProgramKilled) && ctx.Err() != nil {
		// Interrupted from outside (SIGTERM): not a failure.
		return nil
	}
	return err
}
