package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/kpproxy/kp/cmd/kp/fromkubeproxy"
	"github.com/kpproxy/kp/internal/kubeclient"
	"github.com/kpproxy/kp/migrate/cluster"
)

// checkPreflightFlags refuses --print-config and -o where they mean
// nothing.
func (o *migrateClusterOptions) checkPreflightFlags() error {
	switch {
	case o.output != "text" && o.output != "json":
		return fmt.Errorf("-o %q: want text or json", o.output)
	case o.output == "json" && o.printConfig:
		return errors.New("-o json and --print-config: --print-config writes the ConfigMap as YAML")
	case o.printConfig && !o.req.FromKubeProxy:
		return errors.New("--print-config writes kp's ConfigMap from kube-proxy's: it goes with --from-kube-proxy")
	case o.printConfig && o.req.Rollback:
		return errors.New("--print-config and --rollback: choose one")
	}
	return nil
}

func (o *migrateClusterOptions) reader(client kubeclient.Interface, server string) fromkubeproxy.Reader {
	return fromkubeproxy.Reader{Client: client, Namespace: o.namespace, KubeProxyDaemonSet: o.kubeProxyDS, KPDaemonSet: o.kpDS, Server: server}
}

// dryRun prints the plan; from kube-proxy, the preflight too (text), or
// the preflight alone (-o json). An error item fails it.
func (a *app) dryRun(ctx context.Context, o *migrateClusterOptions, c *cluster.Controller, client kubeclient.Interface, server string) error {
	if !o.req.FromKubeProxy {
		return c.PrintPlan(ctx, o.req)
	}
	if o.output == "text" {
		if err := c.PrintPlan(ctx, o.req); err != nil {
			return err
		}
		fmt.Fprintln(a.stdout)
	}
	cl, err := o.reader(client, server).Read(ctx)
	if err != nil {
		return fmt.Errorf("preflight: %w", err)
	}
	target, from, err := fromkubeproxy.Target(o.req.To, cl)
	if err != nil {
		return fmt.Errorf("preflight: %w", err)
	}
	r, err := fromkubeproxy.Preflight(cl, target, from)
	if err != nil {
		return fmt.Errorf("preflight: %w", err)
	}
	if o.output == "json" {
		if err := r.WriteJSON(a.stdout); err != nil {
			return err
		}
	} else {
		r.WriteText(a.stdout)
	}
	if r.Summary.Error > 0 {
		return refusedErrorf("preflight: %d error(s): as configured, kp would not start or not reach the API server; see the items marked ERROR", r.Summary.Error)
	}
	return nil
}

// printKPConfig prints kp's ConfigMap written from kube-proxy's.
func (a *app) printKPConfig(ctx context.Context, o *migrateClusterOptions, client kubeclient.Interface, server string) error {
	cl, err := o.reader(client, server).Read(ctx)
	if err != nil {
		return fmt.Errorf("--print-config: %w", err)
	}
	target, _, err := fromkubeproxy.Target(o.req.To, cl)
	if err != nil {
		return fmt.Errorf("--print-config: %w", err)
	}
	g, err := fromkubeproxy.Generate(cl, target)
	if err != nil {
		return fmt.Errorf("--print-config: %w", err)
	}
	text, err := g.ConfigMap()
	if err != nil {
		return err
	}
	_, err = fmt.Fprint(a.stdout, text)
	return err
}
