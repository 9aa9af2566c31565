package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpproxy/kp/proxy/statusapi"
)

// prepareFromKubeProxy puts the label and the DaemonSets' affinities in
// place before any node moves (each is idempotent, so a re-run redoes
// nothing): every node without the label gets kube-proxy (first: kube-proxy's
// DaemonSet, once it requires the label, must still run everywhere), then
// kube-proxy's DaemonSet requires it, then kp's DaemonSet, which must exist,
// runs where it is not kube-proxy.
func (c *Controller) prepareFromKubeProxy(ctx context.Context, req Request, plan *Plan) error {
	if len(plan.Todo()) == 0 {
		return nil
	}
	if req.Rollback {
		_, _, err := c.ensureAffinity(ctx, c.cfg.KubeProxyDaemonSet, kubeProxyAffinity)
		if notFound(err) {
			return fmt.Errorf("kube-proxy's DaemonSet %s/%s is gone (a migration with --delete-kube-proxy deletes it at the end); "+
				"re-create it, then re-run --rollback", c.cfg.Namespace, c.cfg.KubeProxyDaemonSet)
		}
		return err
	}
	if _, err := c.cfg.Client.AppsV1().DaemonSets(c.cfg.Namespace).Get(ctx, c.cfg.KubeProxyDaemonSet, metav1.GetOptions{}); err != nil {
		return fmt.Errorf("kube-proxy's DaemonSet %s/%s: %w (--kube-proxy-daemonset names it)", c.cfg.Namespace, c.cfg.KubeProxyDaemonSet, err)
	}
	nodes, err := c.cfg.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	var labeled []string
	for _, n := range nodes.Items {
		if _, ok := n.Labels[LabelProxy]; ok {
			continue
		}
		if err := c.patchNode(ctx, n.Name, map[string]*string{LabelProxy: ptr(ProxyKubeProxy)}, nil); err != nil {
			return err
		}
		labeled = append(labeled, n.Name)
	}
	if len(labeled) > 0 {
		c.message("Labeled %s=%s (kube-proxy stays there until its turn): %s", LabelProxy, ProxyKubeProxy, strings.Join(labeled, ", "))
	}
	_, changed, err := c.ensureAffinity(ctx, c.cfg.KubeProxyDaemonSet, kubeProxyAffinity)
	if err != nil {
		return err
	}
	if changed {
		c.message("DaemonSet %s/%s now requires %s in (%s, %s); waiting for its pods to roll over",
			c.cfg.Namespace, c.cfg.KubeProxyDaemonSet, LabelProxy, ProxyKubeProxy, ProxyHandback)
	}
	// Also when unchanged: a re-run after an interrupted rollover.
	if err := c.awaitRollout(ctx, c.cfg.KubeProxyDaemonSet, req); err != nil {
		return fmt.Errorf("DaemonSet %s/%s: %w", c.cfg.Namespace, c.cfg.KubeProxyDaemonSet, err)
	}
	_, changed, err = c.ensureAffinity(ctx, c.cfg.KPDaemonSet, kpAffinity)
	if notFound(err) {
		return fmt.Errorf("kp's DaemonSet %s/%s not found: apply kp's manifests now (kubectl apply -k manifests/; "+
			"every node is labeled %s=%s, so kp starts on none of them yet), then re-run this command",
			c.cfg.Namespace, c.cfg.KPDaemonSet, LabelProxy, ProxyKubeProxy)
	}
	if err != nil {
		return err
	}
	if changed {
		c.message("DaemonSet %s/%s now requires %s not in (%s)", c.cfg.Namespace, c.cfg.KPDaemonSet, LabelProxy, ProxyKubeProxy)
	}
	return nil
}

// takeOver moves one node from kube-proxy to kp: label kp (kube-proxy's
// pod leaves, its rules stay and serve; kp's pod starts, syncs, and removes
// them), then gate on kube-proxy's pod gone, kp ready and synced, and no
// kube-proxy rule left in the kernel.
func (c *Controller) takeOver(ctx context.Context, req Request, node string) error {
	r, n, err := c.newRun(ctx, req, node)
	if err != nil {
		return err
	}
	err = r.step(ctx, "label", func(ctx context.Context) (string, error) {
		if err := r.write(ctx, PhaseRunning); err != nil {
			return "", err
		}
		a := map[string]*string{}
		detail := fmt.Sprintf("%s=%s", LabelProxy, ProxyKP)
		switch cur := n.Annotations[annotationProxyMode]; {
		case req.To != "" && cur != req.To:
			a[annotationProxyMode] = ptr(req.To)
			detail += fmt.Sprintf(", %s=%s (kp starts in it)", annotationProxyMode, req.To)
		case req.To == "" && cur == ModeNone: // left by a rollback
			a[annotationProxyMode] = nil
		}
		return detail, c.patchNode(ctx, node, map[string]*string{LabelProxy: ptr(ProxyKP)}, a)
	})
	if err != nil {
		return err
	}
	if err := r.step(ctx, "kube-proxy leaves", func(ctx context.Context) (string, error) {
		return "no kube-proxy pod on the node (its rules stay until kp has synced)",
			c.wait(ctx, node, "kube-proxy leaves", req.NodeTimeout, func(ctx context.Context) (string, error) {
				pods, err := c.pods(ctx, c.cfg.KubeProxyDaemonSet, node)
				if err != nil || len(pods) == 0 {
					return "", err
				}
				return fmt.Sprintf("kube-proxy pod %s still there", pods[0].Name), nil
			})
	}); err != nil {
		return err
	}
	if err := r.step(ctx, "kp ready", func(ctx context.Context) (string, error) {
		return r.awaitMode(ctx, "kp ready", req.To, -1, time.Time{})
	}); err != nil {
		return err
	}
	if err := r.step(ctx, "take-over", func(ctx context.Context) (string, error) {
		var kp, again string
		looks := 0
		err := c.wait(ctx, node, "take-over", req.NodeTimeout, func(ctx context.Context) (string, error) {
			inv, pending, err := r.inventory(ctx)
			if err != nil || inv == nil {
				return pending, err
			}
			left := programsOf(inv, "kube-proxy")
			if left == "" {
				kp = programsOf(inv, "kp")
				return "", nil
			}
			if looks++; looks == retakeAfter {
				// kp's take-over runs once, after its first sync: rules a
				// kube-proxy still shutting down wrote after it stay. A
				// switch to the mode kp runs removes them again.
				again, err = r.retake(ctx)
				if err != nil {
					return "", err
				}
			}
			return "kube-proxy's rules still in the kernel: " + left, nil
		})
		return "no kube-proxy rule left" + again + "; " + kp, err
	}); err != nil {
		return err
	}
	return r.step(ctx, "record", func(ctx context.Context) (string, error) {
		return "node done: kp serves it", r.write(ctx, PhaseDone)
	})
}

// finishFromKubeProxy checks every node runs kp, and then deletes
// kube-proxy's DaemonSet only when asked (DeleteKubeProxy): kept, it runs
// on no node and is what a rollback gives the nodes back to.
func (c *Controller) finishFromKubeProxy(ctx context.Context, req Request) error {
	nodes, err := c.cfg.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	for _, n := range nodes.Items {
		if n.Labels[LabelProxy] != ProxyKP {
			return fmt.Errorf("node %s: step finish: still labeled %s=%q; re-run to migrate it", n.Name, LabelProxy, n.Labels[LabelProxy])
		}
	}
	dss := c.cfg.Client.AppsV1().DaemonSets(c.cfg.Namespace)
	if !req.DeleteKubeProxy {
		c.message("Every node runs kp. DaemonSet %s/%s is kept and runs nowhere: "+
			"kp migrate cluster --from-kube-proxy --rollback gives the nodes back to it; "+
			"once you are sure, --from-kube-proxy --delete-kube-proxy (or kubectl delete) removes it.", c.cfg.Namespace, c.cfg.KubeProxyDaemonSet)
		return nil
	}
	err = dss.Delete(ctx, c.cfg.KubeProxyDaemonSet, metav1.DeleteOptions{})
	if err != nil && !notFound(err) {
		return fmt.Errorf("step finish: delete DaemonSet %s/%s: %w", c.cfg.Namespace, c.cfg.KubeProxyDaemonSet, err)
	}
	c.message("Every node runs kp. DaemonSet %s/%s deleted.", c.cfg.Namespace, c.cfg.KubeProxyDaemonSet)
	return nil
}

// inventory reads the node's kp's inventory (pending says why not yet).
func (r *nodeRun) inventory(ctx context.Context) (*statusapi.Inventory, string, error) {
	pod, why, err := r.c.kpPod(ctx, r.node)
	if err != nil || pod == nil {
		return nil, why, err
	}
	inv, err := r.c.cfg.KP.Inventory(ctx, pod)
	if err != nil {
		return nil, "", err
	}
	if inv.Error != "" {
		return nil, "", errors.New("kp's inventory: " + inv.Error)
	}
	return inv, "", nil
}

// retakeAfter is how many looks at kube-proxy's leftovers the take-over
// gate waits before asking kp to remove them again.
const retakeAfter = 10

// retake asks the node's kp to take the node over again: the annotation
// kpproxy.io/proxy-mode set to the mode it runs (a switch to the running
// mode re-verifies it and removes every other proxy's rules). When the
// annotation already says so, kp sees no change: nothing to do but wait.
func (r *nodeRun) retake(ctx context.Context) (string, error) {
	_, st, _, err := r.kpStatus(ctx)
	if err != nil || st == nil {
		return "", nil // the gate reads again
	}
	_, _, detail, err := r.setMode(ctx, running(st))
	if err != nil {
		return "", err
	}
	r.c.progress.line(r.node, "retake", "kube-proxy's rules outlived kp's take-over: "+detail)
	return " (after a second take-over: " + detail + ")", nil
}
