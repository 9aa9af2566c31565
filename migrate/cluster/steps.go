package cluster

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpproxy/kp/proxy/statusapi"
)

// nodeRun is one node's part of a rollout: its steps run in order, each
// reported as a progress line and an Event on the Node; the first failure
// is written on the Node (its Record: phase failed, the step, the error)
// and returned as a StepError.
type nodeRun struct {
	c    *Controller
	req  Request
	node string
	rec  *Record
}

func (c *Controller) newRun(ctx context.Context, req Request, node string) (*nodeRun, *v1.Node, error) {
	n, err := c.cfg.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, nil, &StepError{Node: node, Step: "read", Err: err}
	}
	rec, err := RecordOf(n)
	if err != nil {
		return nil, nil, &StepError{Node: node, Step: "read", Err: err}
	}
	if !rec.matches(req) {
		rec = &Record{Kind: req.kind(), To: req.To}
	}
	return &nodeRun{c: c, req: req, node: node, rec: rec}, n, nil
}

// step runs fn as the step called name.
func (r *nodeRun) step(ctx context.Context, name string, fn func(ctx context.Context) (string, error)) error {
	detail, err := fn(ctx)
	if err != nil {
		phase := "migration"
		if r.req.Rollback {
			phase = "rollback"
		}
		r.rec.Phase, r.rec.Step, r.rec.Error = PhaseFailed, name, err.Error()
		if r.req.Rollback {
			r.rec.Step = "rollback " + name
		}
		// The Record is best effort here: the error matters more.
		if werr := r.c.setRecord(context.WithoutCancel(ctx), r.node, r.rec); werr != nil {
			r.c.cfg.Log.Warn("could not record the failure on the Node", "node", r.node, "err", werr)
		}
		r.c.event(context.WithoutCancel(ctx), r.node, "KPMigrationFailed",
			fmt.Sprintf("kp migrate cluster: %s step %s failed: %v", phase, name, err), true)
		return &StepError{Node: r.node, Step: name, Err: err}
	}
	r.c.progress.step(r.node, name, detail)
	r.c.event(ctx, r.node, "KPMigration", "kp migrate cluster: "+name+": "+detail, false)
	return nil
}

// write records r.rec with phase on the Node.
func (r *nodeRun) write(ctx context.Context, phase string) error {
	r.rec.Phase, r.rec.Step, r.rec.Error = phase, "", ""
	return r.c.setRecord(ctx, r.node, r.rec)
}

// kpStatus reads the node's Ready kp pod's status (pending says why not).
func (r *nodeRun) kpStatus(ctx context.Context) (*v1.Pod, *statusapi.Status, string, error) {
	pod, why, err := r.c.kpPod(ctx, r.node)
	if err != nil || pod == nil {
		return nil, nil, why, err
	}
	st, err := r.c.cfg.KP.Status(ctx, pod)
	if err != nil {
		return pod, nil, "", err
	}
	return pod, st, "", nil
}

// awaitMode waits until the node's kp runs want, healthy and synced (after
// a switch newer than afterID, by the kp that started at started).
func (r *nodeRun) awaitMode(ctx context.Context, step, want string, afterID int64, started time.Time) (string, error) {
	var last *statusapi.Status
	err := r.c.wait(ctx, r.node, step, r.req.NodeTimeout, func(ctx context.Context) (string, error) {
		_, st, pending, err := r.kpStatus(ctx)
		if err != nil || st == nil {
			return pending, err
		}
		id := afterID
		if !st.StartTime.Equal(started) {
			id = -1 // a new kp started with the annotation's mode: its IDs start over
		}
		pending, err = synced(st, want, id)
		if err != nil {
			return "", &fatal{err}
		}
		last = st
		return pending, nil
	})
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("kp runs %s, healthy, last synced %s", running(last), last.LastSync.Time.Format(time.RFC3339)), nil
}

// setMode sets the node's kpproxy.io/proxy-mode to mode (remove: "") and
// returns the kp's last switch ID and start time before it, for
// awaitMode (-1 when the annotation had that value already: no switch
// comes).
func (r *nodeRun) setMode(ctx context.Context, mode string) (int64, time.Time, string, error) {
	_, st, pending, err := r.kpStatus(ctx)
	if err == nil && st == nil {
		err = fmt.Errorf("%s", pending)
	}
	if err != nil {
		return 0, time.Time{}, "", err
	}
	var id int64
	if st.Migration != nil {
		id = int64(st.Migration.ID)
	}
	n, err := r.c.cfg.Client.CoreV1().Nodes().Get(ctx, r.node, metav1.GetOptions{})
	if err != nil {
		return 0, time.Time{}, "", err
	}
	if n.Annotations[annotationProxyMode] == mode {
		// No change for kp to see: the gate takes its state as it is.
		return -1, st.StartTime, fmt.Sprintf("%s=%s already", annotationProxyMode, mode), nil
	}
	var v *string
	if mode != "" {
		v = ptr(mode)
	}
	if err := r.c.patchNode(ctx, r.node, nil, map[string]*string{annotationProxyMode: v}); err != nil {
		return 0, time.Time{}, "", err
	}
	return id, st.StartTime, fmt.Sprintf("%s=%s (kp ran %s)", annotationProxyMode, mode, running(st)), nil
}
