package cluster

import (
	"context"
	"fmt"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The two DaemonSets' node affinity on LabelProxy: kp's runs wherever the
// label is not kube-proxy (manifests/daemonset.yaml has it, so a cluster
// without kube-proxy needs no label), kube-proxy's only where it is
// kube-proxy or handback.
var (
	kpAffinity        = v1.NodeSelectorRequirement{Key: LabelProxy, Operator: v1.NodeSelectorOpNotIn, Values: []string{ProxyKubeProxy}}
	kubeProxyAffinity = v1.NodeSelectorRequirement{Key: LabelProxy, Operator: v1.NodeSelectorOpIn, Values: []string{ProxyKubeProxy, ProxyHandback}}
)

// requireAffinity makes ds's pods require req (ANDed into every required
// node selector term, replacing an expression on the same key); it
// reports whether ds changed.
func requireAffinity(ds *appsv1.DaemonSet, req v1.NodeSelectorRequirement) bool {
	spec := &ds.Spec.Template.Spec
	if spec.Affinity == nil {
		spec.Affinity = &v1.Affinity{}
	}
	if spec.Affinity.NodeAffinity == nil {
		spec.Affinity.NodeAffinity = &v1.NodeAffinity{}
	}
	na := spec.Affinity.NodeAffinity
	if na.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		na.RequiredDuringSchedulingIgnoredDuringExecution = &v1.NodeSelector{}
	}
	ns := na.RequiredDuringSchedulingIgnoredDuringExecution
	if len(ns.NodeSelectorTerms) == 0 {
		ns.NodeSelectorTerms = []v1.NodeSelectorTerm{{}}
	}
	changed := false
	for i := range ns.NodeSelectorTerms {
		t := &ns.NodeSelectorTerms[i]
		found := false
		for j, e := range t.MatchExpressions {
			if e.Key != req.Key {
				continue
			}
			found = true
			if e.Operator != req.Operator || !slices.Equal(e.Values, req.Values) {
				t.MatchExpressions[j] = req
				changed = true
			}
		}
		if !found {
			t.MatchExpressions = append(t.MatchExpressions, req)
			changed = true
		}
	}
	return changed
}

// ensureAffinity gets DaemonSet name and updates it to require req.
func (c *Controller) ensureAffinity(ctx context.Context, name string, req v1.NodeSelectorRequirement) (*appsv1.DaemonSet, bool, error) {
	dss := c.cfg.Client.AppsV1().DaemonSets(c.cfg.Namespace)
	ds, err := dss.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, false, err
	}
	if !requireAffinity(ds, req) {
		return ds, false, nil
	}
	ds, err = dss.Update(ctx, ds, metav1.UpdateOptions{})
	if err != nil {
		return nil, false, fmt.Errorf("DaemonSet %s/%s: set node affinity %s %s %v: %w", c.cfg.Namespace, name, req.Key, req.Operator, req.Values, err)
	}
	return ds, true, nil
}

// awaitRollout waits until DaemonSet name runs its current template on
// every node it should, all available.
func (c *Controller) awaitRollout(ctx context.Context, name string, req Request) error {
	return c.wait(ctx, "(cluster)", "DaemonSet "+name, req.NodeTimeout, func(ctx context.Context) (string, error) {
		ds, err := c.cfg.Client.AppsV1().DaemonSets(c.cfg.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		s := ds.Status
		if s.ObservedGeneration < ds.Generation || s.UpdatedNumberScheduled != s.DesiredNumberScheduled ||
			s.NumberAvailable != s.DesiredNumberScheduled || s.NumberUnavailable != 0 {
			return fmt.Sprintf("DaemonSet %s rolling out: %d of %d updated, %d available", name,
				s.UpdatedNumberScheduled, s.DesiredNumberScheduled, s.NumberAvailable), nil
		}
		return "", nil
	})
}

func notFound(err error) bool { return apierrors.IsNotFound(err) }
