package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// switchMode moves one node's kp to req.To: annotate, then gate on kp
// reporting a successful switch to it and a sync after.
func (c *Controller) switchMode(ctx context.Context, req Request, node string) error {
	r, n, err := c.newRun(ctx, req, node)
	if err != nil {
		return err
	}
	err = r.step(ctx, "read", func(ctx context.Context) (string, error) {
		var detail string
		err := c.wait(ctx, node, "read", req.NodeTimeout, func(ctx context.Context) (string, error) {
			_, st, pending, err := r.kpStatus(ctx)
			if err != nil || st == nil {
				return pending, err
			}
			if r.rec.Previous == "" { // a resumed node keeps what it ran first
				r.rec.Previous, r.rec.PreviousAnnotation = running(st), n.Annotations[annotationProxyMode]
			}
			detail = fmt.Sprintf("kp runs %s; will switch to %s", running(st), req.To)
			return "", nil
		})
		if err != nil {
			return "", err
		}
		return detail, r.write(ctx, PhaseRunning)
	})
	if err != nil {
		return err
	}
	var id int64
	var started time.Time
	err = r.step(ctx, "annotate", func(ctx context.Context) (detail string, err error) {
		id, started, detail, err = r.setMode(ctx, req.To)
		return detail, err
	})
	if err != nil {
		return err
	}
	if err := r.step(ctx, "switch", func(ctx context.Context) (string, error) {
		return r.awaitMode(ctx, "switch", req.To, id, started)
	}); err != nil {
		return err
	}
	return r.step(ctx, "record", func(ctx context.Context) (string, error) {
		return "node done", r.write(ctx, PhaseDone)
	})
}

// switchBack returns one node's kp to the mode it ran before the rollout,
// restores its kpproxy.io/proxy-mode annotation and removes the Record.
func (c *Controller) switchBack(ctx context.Context, req Request, node string) error {
	r, _, err := c.newRun(ctx, req, node)
	if err != nil {
		return err
	}
	prev := r.rec.Previous
	if prev == "" {
		return &StepError{Node: node, Step: "read", Err: errors.New("the node's record names no previous mode to return to")}
	}
	var id int64
	var started time.Time
	err = r.step(ctx, "annotate", func(ctx context.Context) (detail string, err error) {
		if err := r.write(ctx, PhaseRollingBack); err != nil {
			return "", err
		}
		id, started, detail, err = r.setMode(ctx, prev)
		return detail, err
	})
	if err != nil {
		return err
	}
	if err := r.step(ctx, "switch", func(ctx context.Context) (string, error) {
		return r.awaitMode(ctx, "switch", prev, id, started)
	}); err != nil {
		return err
	}
	return r.step(ctx, "restore", func(ctx context.Context) (string, error) {
		a := map[string]*string{AnnotationMigration: nil}
		detail := "removed " + annotationProxyMode
		switch pa := r.rec.PreviousAnnotation; {
		case pa == "":
			a[annotationProxyMode] = nil
		case pa == prev:
			detail = fmt.Sprintf("%s=%s as before", annotationProxyMode, pa)
		default:
			// Restoring it would switch kp away from prev again.
			detail = fmt.Sprintf("kept %s=%s (it was %s, which kp did not run)", annotationProxyMode, prev, pa)
		}
		return detail + "; record removed", c.patchNode(ctx, node, nil, a)
	})
}
