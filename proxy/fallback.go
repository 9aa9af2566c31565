package proxy

import (
	"context"
	"errors"
	"fmt"
)

// Refusal is why a mode was not started: it could not be built, or its
// Probe failed on this kernel.
type Refusal struct {
	Mode   Mode
	Reason error
}

// FirstThatRuns is the automatic mode choice: it builds each mode of modes
// in order (the fallback order) and starts the first whose Probe passes.
// It returns that backend and the modes refused before it; when none runs,
// an error joining every reason.
func FirstThatRuns(ctx context.Context, modes []Mode, build func(Mode) (Backend, error)) (Backend, []Refusal, error) {
	var refused []Refusal
	for _, m := range modes {
		b, err := build(m)
		if err == nil {
			if err = Probe(ctx, b); err == nil {
				return b, refused, nil
			}
		}
		refused = append(refused, Refusal{Mode: m, Reason: err})
	}
	errs := make([]error, len(refused))
	for i, r := range refused {
		errs[i] = r.Reason
	}
	return nil, refused, fmt.Errorf("no proxy mode can run on this node:\n%w", errors.Join(errs...))
}

// Probe asks b whether this kernel can run its mode, naming the mode in
// the error.
func Probe(ctx context.Context, b Backend) error {
	if err := b.Probe(ctx); err != nil {
		return fmt.Errorf("%s mode cannot run on this node: %w", b.Mode(), err)
	}
	return nil
}
