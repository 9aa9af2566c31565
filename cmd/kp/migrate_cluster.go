package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kpproxy/kp/internal/kubeclient"
	"github.com/kpproxy/kp/migrate/cluster"
	"github.com/kpproxy/kp/proxy"
)

type migrateClusterOptions struct {
	req                          cluster.Request
	kubeconfig, context          string
	namespace, kpDS, kubeProxyDS string
	healthzPort                  string
	dryRun                       bool
}

func newMigrateClusterCommand(a *app) *cobra.Command {
	o := &migrateClusterOptions{}
	cmd := &cobra.Command{
		Use:   "cluster (--to MODE | --from-kube-proxy [--to MODE])",
		Short: "Move every node, one at a time, from kube-proxy to kp or between kp modes, through the API server",
		Long: `Move the cluster's nodes one by one (--max-unavailable at a time), through the API
server (--kubeconfig, or KUBECONFIG, or ~/.kube/config, as kubectl), each node's step
gated on that node's kp being Ready, healthy and synced in the new mode: kp's own
status and inventory, read through the API server's pod proxy on kp's healthz port
(/kp/v1/status, /kp/v1/inventory). Progress is printed as lines: nodes done, in
flight, left, and each node's steps; each step is also an Event on its Node.

--to MODE (kp runs everywhere): per node, set the annotation
` + proxy.AnnotationProxyMode + `=MODE (the node's kp switches: programs MODE while the
old mode serves, verifies, removes the old rules), wait until it reports MODE and a
sync after the switch, then the next node.

--from-kube-proxy: the node label ` + cluster.LabelProxy + ` decides which proxy runs
where. First every node is labeled ` + cluster.ProxyKubeProxy + `, kube-proxy's DaemonSet is
patched to require that (or ` + cluster.ProxyHandback + `) and kp's to run where it is
not ` + cluster.ProxyKubeProxy + ` (manifests/daemonset.yaml has it); kp's DaemonSet must
exist (the command says when to apply it). Per node: label ` + cluster.ProxyKP + ` → kube-proxy's
pod leaves (its rules stay in the kernel and keep serving), kp's pod starts, syncs,
and removes kube-proxy's rules → gate on kp ready and synced and no kube-proxy rule
left in the kernel → next node. At the end kube-proxy's DaemonSet is deleted, unless
--keep-kube-proxy. With --to, kp starts in MODE on each node.

On a failed node the rollout pauses (--pause, the default): nodes not started yet
stay untouched, the failure (step, error) is recorded on the Node (annotation
` + cluster.AnnotationMigration + `), and re-running the same command resumes there.
--rollback reverses the nodes the rollout reached, last first: for --to, each goes
back to the mode it ran before; for --from-kube-proxy (needs --keep-kube-proxy's
DaemonSet), each goes back to kube-proxy without a gap: kube-proxy starts next to kp
(label ` + cluster.ProxyHandback + `) and is gated on its rules being in the kernel, then kp
switches to mode none (removes its rules, leaves kube-proxy's), then leaves. That
hand-back needs every node's kp to run with --allow-mode-none (add it to kp's
DaemonSet command first): a kp without it refuses mode none, changes nothing, says why
in an Event on its Node, and the rollback stops at that node.`,
		Example: `  # From kube-proxy to kp, one node at a time, keeping kube-proxy's DaemonSet
  kp migrate cluster --from-kube-proxy --keep-kube-proxy
  # (the first run labels the nodes and asks for kp's DaemonSet if it is missing:)
  kubectl apply -k manifests/
  kp migrate cluster --from-kube-proxy --keep-kube-proxy

  # Every node's kp to the iptables mode, two nodes at a time
  kp migrate cluster --to iptables --max-unavailable 2 --kubeconfig ~/.kube/config

  # The plan only
  kp migrate cluster --to iptables --dry-run

  # After a pause: fix the node, then the same command resumes; or undo
  kp migrate cluster --to iptables
  kp migrate cluster --to iptables --rollback
  # (back to kube-proxy: kp's DaemonSet must run kp proxy with --allow-mode-none)
  kp migrate cluster --from-kube-proxy --rollback`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.migrateCluster(cmd.Context(), o)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.req.To, "to", "", "the mode to move to: nftables, iptables, iptables-nft, iptables-legacy, ipvs, userspace")
	fs.BoolVar(&o.req.FromKubeProxy, "from-kube-proxy", false, "move the nodes from upstream kube-proxy's DaemonSet to kp's")
	fs.IntVar(&o.req.MaxUnavailable, "max-unavailable", 1, "nodes in flight at once")
	fs.BoolVar(&o.req.Pause, "pause", true, "stop at the first failed node (re-run to resume); --pause=false goes on with the others")
	fs.BoolVar(&o.req.Rollback, "rollback", false, "reverse the nodes this rollout reached, last first "+
		"(with --from-kube-proxy: kp must run with --allow-mode-none)")
	fs.BoolVar(&o.req.KeepKubeProxy, "keep-kube-proxy", false, "with --from-kube-proxy: keep kube-proxy's DaemonSet at the end, for --rollback")
	fs.DurationVar(&o.req.NodeTimeout, "node-timeout", 5*time.Minute, "give up a node's step after this long")
	fs.BoolVar(&o.dryRun, "dry-run", false, "print the plan and stop")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "the kubeconfig file (default: KUBECONFIG, then ~/.kube/config)")
	fs.StringVar(&o.context, "context", "", "the kubeconfig context to use")
	fs.StringVar(&o.namespace, "namespace", "kube-system", "the namespace of both DaemonSets")
	fs.StringVar(&o.kpDS, "kp-daemonset", "kp", "kp's DaemonSet")
	fs.StringVar(&o.kubeProxyDS, "kube-proxy-daemonset", "kube-proxy", "kube-proxy's DaemonSet")
	fs.StringVar(&o.healthzPort, "healthz-port", cluster.DefaultHealthzPort, "kp's healthz port, where it serves its status to the pod proxy")
	return cmd
}

func (a *app) migrateCluster(ctx context.Context, o *migrateClusterOptions) error {
	if o.req.To != "" {
		if _, err := proxy.ParseTarget(o.req.To); err != nil {
			return fmt.Errorf("--to: %w", err)
		}
	}
	if err := o.req.Validate(); err != nil {
		return err
	}
	client, err := clusterClient(o.kubeconfig, o.context)
	if err != nil {
		return err
	}
	c := cluster.New(cluster.Config{Client: client, KP: cluster.PodProxy{Client: client, Port: o.healthzPort},
		Namespace: o.namespace, KPDaemonSet: o.kpDS, KubeProxyDaemonSet: o.kubeProxyDS, Out: a.stdout, Log: a.log})
	if o.dryRun {
		return c.PrintPlan(ctx, o.req)
	}
	err = c.Run(ctx, o.req)
	var se *cluster.StepError
	if errors.As(err, &se) {
		return fmt.Errorf("migrate cluster: %w", err)
	}
	return err
}

// clusterClient builds an API client as kubectl does: --kubeconfig, else
// KUBECONFIG, else ~/.kube/config (or the in-cluster configuration).
func clusterClient(kubeconfig, context string) (kubeclient.Interface, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules,
		&clientcmd.ConfigOverrides{CurrentContext: context}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("API client (--kubeconfig, KUBECONFIG or ~/.kube/config): %w", err)
	}
	cfg.UserAgent = "kp-migrate-cluster"
	return kubeclient.New(cfg)
}
