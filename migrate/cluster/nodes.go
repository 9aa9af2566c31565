package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
)

// What the rollout reads and writes of Nodes and pods.

// patchNode sets (or, for a nil value, removes) labels and annotations of
// node in one merge patch.
func (c *Controller) patchNode(ctx context.Context, node string, lbls, annotations map[string]*string) error {
	meta := map[string]any{}
	if len(lbls) > 0 {
		meta["labels"] = lbls
	}
	if len(annotations) > 0 {
		meta["annotations"] = annotations
	}
	patch, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		return err
	}
	if _, err := c.cfg.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("patch node %s: %w", node, err)
	}
	return nil
}

func ptr(s string) *string { return &s }

// setRecord writes rec on node (nil removes it).
func (c *Controller) setRecord(ctx context.Context, node string, rec *Record) error {
	var v *string
	if rec != nil {
		rec.Time = c.cfg.Clock.Now().UTC().Truncate(time.Second)
		v = ptr(rec.String())
	}
	return c.patchNode(ctx, node, nil, map[string]*string{AnnotationMigration: v})
}

// event records what happened on node as an Event on it (kubectl describe
// node), as kubelet records its own: in the default namespace, the Node's
// name as its UID. A failure to record is logged, not fatal.
func (c *Controller) event(ctx context.Context, node, reason, msg string, warning bool) {
	typ := v1.EventTypeNormal
	if warning {
		typ = v1.EventTypeWarning
	}
	t := metav1.NewTime(c.cfg.Clock.Now())
	ev := &v1.Event{
		ObjectMeta:          metav1.ObjectMeta{GenerateName: node + ".kp-migrate-", Namespace: metav1.NamespaceDefault},
		InvolvedObject:      v1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: node, UID: types.UID(node)},
		Reason:              reason,
		Message:             msg,
		Type:                typ,
		Source:              v1.EventSource{Component: "kp-migrate-cluster"},
		FirstTimestamp:      t,
		LastTimestamp:       t,
		Count:               1,
		ReportingController: "kpproxy.io/kp-migrate-cluster",
		ReportingInstance:   "kp-migrate-cluster",
	}
	if _, err := c.cfg.Client.CoreV1().Events(ev.Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		c.cfg.Log.Warn("could not record an Event on the Node", "node", node, "reason", reason, "err", err)
	}
}

// pods lists the pods of DaemonSet ds on node, the terminating ones too.
func (c *Controller) pods(ctx context.Context, ds, node string) ([]v1.Pod, error) {
	d, err := c.cfg.Client.AppsV1().DaemonSets(c.cfg.Namespace).Get(ctx, ds, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("DaemonSet %s/%s: %w", c.cfg.Namespace, ds, err)
	}
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		return nil, fmt.Errorf("DaemonSet %s/%s: selector: %w", c.cfg.Namespace, ds, err)
	}
	return c.podsMatching(ctx, sel, node)
}

func (c *Controller) podsMatching(ctx context.Context, sel labels.Selector, node string) ([]v1.Pod, error) {
	list, err := c.cfg.Client.CoreV1().Pods(c.cfg.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: sel.String(), FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return nil, fmt.Errorf("list pods %s on node %s: %w", sel, node, err)
	}
	var out []v1.Pod
	for _, p := range list.Items {
		if p.Spec.NodeName == node { // a fake clientset ignores field selectors
			out = append(out, p)
		}
	}
	return out, nil
}

// readyPod is the one pod of pods that runs, is Ready and is not being
// deleted (nil, with why, when there is none).
func readyPod(pods []v1.Pod) (*v1.Pod, string) {
	why := "no pod"
	for i := range pods {
		p := &pods[i]
		switch {
		case p.DeletionTimestamp != nil:
			why = "pod " + p.Name + " is terminating"
		case p.Status.Phase != v1.PodRunning:
			why = fmt.Sprintf("pod %s is %s", p.Name, p.Status.Phase)
		case !podReady(p):
			why = "pod " + p.Name + " is not Ready"
		default:
			return p, ""
		}
	}
	return nil, why
}

func podReady(p *v1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == v1.PodReady {
			return cond.Status == v1.ConditionTrue
		}
	}
	return false
}

// kpPod returns the node's Ready kp pod, or why there is none yet.
func (c *Controller) kpPod(ctx context.Context, node string) (*v1.Pod, string, error) {
	pods, err := c.pods(ctx, c.cfg.KPDaemonSet, node)
	if err != nil {
		return nil, "", err
	}
	p, why := readyPod(pods)
	return p, "kp: " + why, nil
}

// wait polls cond until it reports nothing pending, fails, or timeout
// passes; cond's read errors are retried (the API server or a pod being
// briefly unreachable is no failure) and the last one is reported.
func (c *Controller) wait(ctx context.Context, node, step string, timeout time.Duration, cond func(ctx context.Context) (pending string, err error)) error {
	deadline := c.cfg.Clock.Now().Add(timeout)
	last := ""
	for {
		pending, err := cond(ctx)
		var se *fatal
		if asFatal(err, &se) {
			return se.err
		}
		if err == nil && pending == "" {
			return nil
		}
		if err != nil {
			pending = err.Error()
		}
		if pending != last {
			c.progress.waiting(node, step, pending)
			last = pending
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !c.cfg.Clock.Now().Before(deadline) {
			return fmt.Errorf("not done within %s: %s", timeout, pending)
		}
		c.cfg.Clock.Sleep(c.cfg.PollInterval)
	}
}

// fatal marks a gate's error that retrying cannot fix (kp reported its
// switch failed).
type fatal struct{ err error }

func (f *fatal) Error() string { return f.err.Error() }

func asFatal(err error, out **fatal) bool {
	f, ok := err.(*fatal)
	if ok {
		*out = f
	}
	return ok
}
