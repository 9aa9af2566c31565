package cluster

import (
	"context"
	"fmt"
	"time"
)

// handBack gives one node back to kube-proxy with no gap (the package
// doc): label handback, gate on kube-proxy's pod and rules, kp to mode
// none, gate on kp's rules gone and kube-proxy's still there, label
// kube-proxy, gate on kp's pod gone, remove the annotations.
func (c *Controller) handBack(ctx context.Context, req Request, node string) error {
	r, _, err := c.newRun(ctx, req, node)
	if err != nil {
		return err
	}
	err = r.step(ctx, "label handback", func(ctx context.Context) (string, error) {
		if err := r.write(ctx, PhaseRollingBack); err != nil {
			return "", err
		}
		return fmt.Sprintf("%s=%s: kube-proxy's pod starts next to kp's", LabelProxy, ProxyHandback),
			c.patchNode(ctx, node, map[string]*string{LabelProxy: ptr(ProxyHandback)}, nil)
	})
	if err != nil {
		return err
	}
	if err := r.step(ctx, "kube-proxy ready", func(ctx context.Context) (string, error) {
		return c.awaitKubeProxyServes(ctx, r, req, node)
	}); err != nil {
		return err
	}
	var id int64
	var started time.Time
	if err := r.step(ctx, "kp to none", func(ctx context.Context) (detail string, err error) {
		id, started, detail, err = r.setMode(ctx, ModeNone)
		return detail, err
	}); err != nil {
		return err
	}
	if err := r.step(ctx, "kp rules gone", func(ctx context.Context) (string, error) {
		if _, err := r.awaitMode(ctx, "kp rules gone", ModeNone, id, started); err != nil {
			return "", err
		}
		return c.awaitKPRulesGone(ctx, r, req, node)
	}); err != nil {
		return err
	}
	if err := r.step(ctx, "kp leaves", func(ctx context.Context) (string, error) {
		if err := c.patchNode(ctx, node, map[string]*string{LabelProxy: ptr(ProxyKubeProxy)}, nil); err != nil {
			return "", err
		}
		return fmt.Sprintf("%s=%s; kp's pod is gone", LabelProxy, ProxyKubeProxy),
			c.wait(ctx, node, "kp leaves", req.NodeTimeout, func(ctx context.Context) (string, error) {
				pods, err := c.pods(ctx, c.cfg.KPDaemonSet, node)
				if err != nil || len(pods) == 0 {
					return "", err
				}
				return fmt.Sprintf("kp pod %s still there", pods[0].Name), nil
			})
	}); err != nil {
		return err
	}
	return r.step(ctx, "restore", func(ctx context.Context) (string, error) {
		return "removed " + annotationProxyMode + " and the record: kube-proxy serves the node",
			c.patchNode(ctx, node, nil, map[string]*string{annotationProxyMode: nil, AnnotationMigration: nil})
	})
}

// awaitKubeProxyServes waits until kube-proxy's pod is ready on node and
// its rules are in the kernel for every service port kp serves.
func (c *Controller) awaitKubeProxyServes(ctx context.Context, r *nodeRun, req Request, node string) (string, error) {
	var detail string
	seen := 0
	err := c.wait(ctx, node, "kube-proxy ready", req.NodeTimeout, func(ctx context.Context) (string, error) {
		pods, err := c.pods(ctx, c.cfg.KubeProxyDaemonSet, node)
		if err != nil {
			return "", err
		}
		if p, why := readyPod(pods); p == nil {
			return "kube-proxy: " + why, nil
		}
		_, st, pending, err := r.kpStatus(ctx)
		if err != nil || st == nil {
			return pending, err
		}
		inv, pending, err := r.inventory(ctx)
		if err != nil || inv == nil {
			return pending, err
		}
		if !kubeProxyServes(inv, st.ServicePorts) {
			seen = 0
			return fmt.Sprintf("kube-proxy's rules not in the kernel yet for kp's %d service ports (%s)", st.ServicePorts, programsOf(inv, "kube-proxy")), nil
		}
		// kube-proxy's iptables-restore commits its filter table, then
		// its nat table: a look between the two sees half a sync. A
		// second look, a poll interval later, sees both.
		if seen++; seen < 2 {
			return "kube-proxy's rules seen; looking again", nil
		}
		detail = "kube-proxy runs and its rules are in the kernel: " + programsOf(inv, "kube-proxy")
		return "", nil
	})
	return detail, err
}

// awaitKPRulesGone waits until none of kp's rules is left on node while
// kube-proxy's still serve.
func (c *Controller) awaitKPRulesGone(ctx context.Context, r *nodeRun, req Request, node string) (string, error) {
	var detail string
	err := c.wait(ctx, node, "kp rules gone", req.NodeTimeout, func(ctx context.Context) (string, error) {
		inv, pending, err := r.inventory(ctx)
		if err != nil || inv == nil {
			return pending, err
		}
		if left := programsOf(inv, "kp"); left != "" {
			return "kp's rules still in the kernel: " + left, nil
		}
		if programsOf(inv, "kube-proxy") == "" {
			return "", &fatal{fmt.Errorf("kube-proxy's rules are gone too: kube-proxy does not serve the node")}
		}
		detail = "kp runs mode none, none of its rules left; kube-proxy's serve: " + programsOf(inv, "kube-proxy")
		return "", nil
	})
	return detail, err
}
