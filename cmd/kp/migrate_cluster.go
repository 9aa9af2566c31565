package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kpproxy/kp/internal/kubeclient"
	"github.com/kpproxy/kp/migrate/cluster"
	"github.com/kpproxy/kp/proxy"
)

type migrateClusterOptions struct {
	req                          cluster.Request
	kubeconfig, context          string
	namespace, kpDS, kubeProxyDS string
	kpContainer                  string
	dryRun                       bool
	// keepKubeProxy is the old --keep-kube-proxy: now the default.
	keepKubeProxy bool
	output        string
	printConfig   bool
}

const migrateClusterLong = `Move the cluster's nodes one by one (--max-unavailable at a time), through the API
server (--kubeconfig, or KUBECONFIG, or ~/.kube/config, as kubectl), each node's step
gated on that node's kp being Ready, healthy and synced in the new mode: kp's own
status and inventory, read as kubectl exec would, by running 'kp status -o json'
(and --inventory) in the node's kp pod (kp serves them on a root-only socket, never
on the network). The caller needs create on pods/exec in kp's namespace, besides
what the steps change (docs/security.md lists it). Progress is printed as lines: nodes done, in
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
left in the kernel → next node. kube-proxy's DaemonSet is kept (running on no node):
it is the way back, --rollback needs it. --delete-kube-proxy deletes it once every
node runs kp (also on a later run, when all are done). With --to, kp starts in MODE
on each node.

On a failed node the rollout pauses (--pause, the default): nodes not started yet
stay untouched, the failure (step, error) is recorded on the Node (annotation
` + cluster.AnnotationMigration + `), and re-running the same command resumes there.
--rollback reverses the nodes the rollout reached, last first: for --to, each goes
back to the mode it ran before; for --from-kube-proxy (needs kube-proxy's DaemonSet,
kept unless --delete-kube-proxy), each goes back to kube-proxy without a gap:
kube-proxy starts next to kp (label ` + cluster.ProxyHandback + `) and is gated on its rules being
in the kernel, then kp switches to mode none (removes its rules, leaves
kube-proxy's), then leaves. That hand-back needs every node's kp to run with
--allow-mode-none (add it to kp's DaemonSet command first): a kp without it
refuses mode none, changes nothing, says why in an Event on its Node, and the
rollback stops at that node.

--from-kube-proxy --dry-run prints the plan, then the preflight: what will
behave differently once kp serves, read from kube-proxy's configuration (its
DaemonSet's --config ConfigMap, kubeadm's kube-system/kube-proxy config.conf, or
its flags) and the Nodes (addresses, podCIDRs, CPUs): per item what kube-proxy
does, what kp in the target mode will do (with kp's ConfigMap when it exists,
else the one --print-config writes), a severity (ok, info, warning, error) and
what to do. Items on every node: mode, config, api-server, masquerade-all,
ipvs-scheduler, strict-arp, detect-local-mode; per node: localhost-nodeports,
nodeport-addresses, cluster-cidr, conntrack. -o json writes the preflight alone
as JSON: {"kubeProxy": {"mode", "config"}, "kp": {"mode", "modeFrom", "config", "generated"},
"cluster": [ITEM], "nodes": [{"node", "addresses", "podCIDRs", "cpus", "items":
[ITEM]}], "summary": {"ok", "info", "warning", "error"}}, ITEM being {"id",
"severity", "kubeProxy", "kp", "action"}. An error item makes the dry run fail
(exit 3, refused).
The target mode is --to, else the mode of kp's ConfigMap, else nftables.

Otherwise -o json writes the plan and the progress as JSON Lines, one object a
line, each with its "type" and "time": "plan" (plan: kind, to, rollback,
maxUnavailable, nodes: [{node, action, reason}]), "message" (what the command
did beside the nodes' steps), "progress" (node, state: started, step, waiting,
retake, done or failed; step, detail, counts: {done, inFlight, left, failed}),
"summary" (counts), and last "result" (exitCode, error).

--from-kube-proxy --print-config prints kp's ConfigMap written from
kube-proxy's configuration (clusterCIDR, the API server's address, NodePort
addresses, detectLocalMode and its interfaces, masquerading, sync periods, ipvs
settings, conntrack), for kubectl apply before kp's DaemonSet.`

func newMigrateClusterCommand(a *app) *cobra.Command {
	o := &migrateClusterOptions{}
	cmd := &cobra.Command{
		Use:   "cluster (--to MODE | --from-kube-proxy [--to MODE])",
		Short: "Move every node, one at a time, from kube-proxy to kp or between kp modes, through the API server",
		Long:  migrateClusterLong,
		Example: `  # From kube-proxy to kp, one node at a time (kube-proxy's DaemonSet is kept)
  kp migrate cluster --from-kube-proxy
  # (the first run labels the nodes and asks for kp's DaemonSet if it is missing:)
  kubectl apply -k manifests/
  kp migrate cluster --from-kube-proxy
  # Once sure there is no way back to take: delete kube-proxy's DaemonSet
  kp migrate cluster --from-kube-proxy --delete-kube-proxy

  # Every node's kp to the iptables mode, two nodes at a time
  kp migrate cluster --to iptables --max-unavailable 2 --kubeconfig ~/.kube/config

  # The plan only
  kp migrate cluster --to iptables --dry-run

  # Before leaving kube-proxy: what changes, per node; kp's ConfigMap from kube-proxy's
  kp migrate cluster --from-kube-proxy --dry-run
  kp migrate cluster --from-kube-proxy --dry-run -o json
  kp migrate cluster --from-kube-proxy --print-config | kubectl apply -f -

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
	fs.BoolVar(&o.req.DeleteKubeProxy, "delete-kube-proxy", false,
		"with --from-kube-proxy: delete kube-proxy's DaemonSet once every node runs kp (without it the DaemonSet is kept, on no node, for --rollback)")
	fs.BoolVar(&o.keepKubeProxy, "keep-kube-proxy", false, "keep kube-proxy's DaemonSet (the default now)")
	_ = fs.MarkDeprecated("keep-kube-proxy", "kube-proxy's DaemonSet is kept by default; --delete-kube-proxy deletes it")
	fs.DurationVar(&o.req.NodeTimeout, "node-timeout", 5*time.Minute, "give up a node's step after this long")
	fs.BoolVar(&o.dryRun, "dry-run", false, "print the plan and stop; with --from-kube-proxy, also the preflight (what changes once kp serves)")
	fs.StringVarP(&o.output, "output", "o", "text", "text, or json: JSON Lines of the plan and the progress, then the result (with --from-kube-proxy --dry-run: the preflight alone, one JSON document)")
	fs.BoolVar(&o.printConfig, "print-config", false, "with --from-kube-proxy: print kp's ConfigMap written from kube-proxy's configuration, and stop")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "the kubeconfig file (default: KUBECONFIG, then ~/.kube/config)")
	fs.StringVar(&o.context, "context", "", "the kubeconfig context to use")
	fs.StringVar(&o.namespace, "namespace", "kube-system", "the namespace of both DaemonSets")
	fs.StringVar(&o.kpDS, "kp-daemonset", "kp", "kp's DaemonSet")
	fs.StringVar(&o.kubeProxyDS, "kube-proxy-daemonset", "kube-proxy", "kube-proxy's DaemonSet")
	fs.StringVar(&o.kpContainer, "kp-container", "", "kp's container in its pods, where kp status runs (default: the one named kp, else the first)")
	fs.String("healthz-port", "", "unused: kp's status is read through pods/exec now")
	_ = fs.MarkDeprecated("healthz-port", "kp's status is read through pods/exec (kp status in kp's pod), not the healthz port")
	return cmd
}

func (a *app) migrateCluster(ctx context.Context, o *migrateClusterOptions) error {
	if o.req.To != "" {
		if _, err := proxy.ParseTarget(o.req.To); err != nil {
			return usageErrorf("--to: %w", err)
		}
	}
	if o.keepKubeProxy && o.req.DeleteKubeProxy {
		return usageErrorf("--keep-kube-proxy and --delete-kube-proxy: choose one (keeping is the default)")
	}
	if err := o.req.Validate(); err != nil {
		return usage(err)
	}
	if err := o.checkPreflightFlags(); err != nil {
		return usage(err)
	}
	if o.output == "json" && !(o.dryRun && o.req.FromKubeProxy) && !o.printConfig {
		err := a.runMigrateCluster(ctx, o)
		a.jsonResult(err)
		return err
	}
	return a.runMigrateCluster(ctx, o)
}

// runMigrateCluster runs kp migrate cluster once its flags are checked.
func (a *app) runMigrateCluster(ctx context.Context, o *migrateClusterOptions) error {
	client, server, err := a.clusterClient(o.kubeconfig, o.context)
	if err != nil {
		return err
	}
	if o.printConfig {
		return a.printKPConfig(ctx, o, client, server)
	}
	kp := cluster.PodExec{Container: o.kpContainer}
	if rc, ok := client.(interface{ RESTConfig() *rest.Config }); ok {
		kp.Config = rc.RESTConfig()
	}
	c := cluster.New(cluster.Config{Client: client, KP: kp,
		Namespace: o.namespace, KPDaemonSet: o.kpDS, KubeProxyDaemonSet: o.kubeProxyDS, Out: a.stdout, JSON: o.output == "json", Log: a.log})
	if o.dryRun {
		return a.dryRun(ctx, o, c, client, server)
	}
	err = c.Run(ctx, o.req)
	var se *cluster.StepError
	if errors.As(err, &se) {
		return fmt.Errorf("migrate cluster: %w", err)
	}
	return err
}

// clusterClient builds an API client as kubectl does: --kubeconfig, else
// KUBECONFIG, else ~/.kube/config (or the in-cluster configuration); it
// returns the API server's address too.
func clusterClient(kubeconfig, context string) (kubeclient.Interface, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules,
		&clientcmd.ConfigOverrides{CurrentContext: context}).ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("API client (--kubeconfig, KUBECONFIG or ~/.kube/config): %w", err)
	}
	cfg.UserAgent = "kp-migrate-cluster"
	c, err := kubeclient.New(cfg)
	return c, cfg.Host, err
}
