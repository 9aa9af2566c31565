package main

import (
	"context"
	"time"

	"github.com/spf13/cobra"

	"github.com/kpproxy/kp/internal/nsenter"
	"github.com/kpproxy/kp/migrate"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

func newMigrateCommand(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Move a node between proxy modes, or from kube-proxy to kp, without dropping a connection",
		Long: `Move a node's Services from what programs them now (kp in another mode, upstream
kube-proxy's leftovers) to a kp mode, with a plan first and a proof at the end;
or a whole cluster, node by node, from kube-proxy to kp or between kp modes.`,
		Example: `  # On the node, as root: what would change, then do it
  kp migrate node --to iptables --dry-run
  kp migrate node --to iptables

  # The whole cluster, node by node, through the API server
  kp migrate cluster --from-kube-proxy
  kp migrate cluster --to iptables`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newMigrateNodeCommand(a), newMigrateClusterCommand(a))
	return cmd
}

type migrateNodeOptions struct {
	to      string
	dryRun  bool
	node    nodeFlags
	timeout time.Duration
	output  string
}

func newMigrateNodeCommand(a *app) *cobra.Command {
	o := &migrateNodeOptions{}
	cmd := &cobra.Command{
		Use:   "node --to MODE",
		Short: "Switch this node's running kp to another mode, verified, with no gap",
		Long: `Switch the kp proxy running on this node to MODE (nftables, iptables, iptables-nft,
iptables-legacy, userspace) and remove every other proxy's rules.

It prints the plan first: what programs this node's Services now (kp in which mode,
upstream kube-proxy's rules in which mode) with counts of chains, rules, set
elements and virtual servers, what will be added and what removed. --dry-run stops
there. Then the running kp (asked through its status API on the node's loopback)
programs MODE fully while the old rules still serve; proves from inside the node
that every Service with endpoints goes through the new rules (a connection to each
ClusterIP, and MODE's own per-endpoint counters for that Service moving); makes
MODE current; and removes the old mode's rules and kube-proxy's leftovers. If
programming or the proof fails, MODE's rules are removed and the old mode keeps
serving. Established connections keep their conntrack entries and survive.

Re-running is safe: each step is idempotent and the plan starts from what the
node has. Asking for the mode kp already runs re-verifies it and removes any
leftovers (kube-proxy's rules re-created by a kube-proxy that was still running,
an interrupted switch's).

The switch lives in the running kp. To keep it across restarts, record it on the
Node: the annotation ` + proxy.AnnotationProxyMode + `=MODE (kubectl annotate; with
--manifests, in the Node's file) makes kp switch when it sees it, and start in
MODE afterwards.

-o json writes JSON Lines, one object a line, each with its "type": "plan"
(running, target, healthy, servicePorts, endpoints, programs: what programs the
node's Services now, add, remove, nothingToDo, dryRun), "message", "step" (each
step as it ends: name, detail, error, started, ended), "warning" (the verify
step's), "report" (target, programs after the switch, keptForConnections), and
last "result" (exitCode, error).`,
		Example: `  # On the node, as root: the plan only
  kp migrate node --to iptables --dry-run

  # Switch to the iptables mode with the iptables-legacy binaries
  kp migrate node --to iptables-legacy

  # kp runs in the network namespace node-1 (ip netns add node-1)
  kp migrate node --netns node-1 --to nftables

  # For a script: the plan and each step as JSON Lines, then the result
  kp migrate node --to iptables -o json

  # Persistently, through the API server (kp switches when it sees the annotation)
  kubectl annotate node node-1 ` + proxy.AnnotationProxyMode + `=nftables --overwrite`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.migrateNode(cmd.Context(), o)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.to, "to", "", "the mode to switch to: nftables, iptables, iptables-nft, iptables-legacy, userspace")
	fs.BoolVar(&o.dryRun, "dry-run", false, "print the plan and stop")
	o.node.bind(fs, "the node's network namespace, if not this one")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Minute, "give up waiting for the switch after this long")
	fs.StringVarP(&o.output, "output", "o", "text", "text, or json (JSON Lines: the plan, each step, the result)")
	_ = cmd.MarkFlagRequired("to")
	return cmd
}

func (a *app) migrateNode(ctx context.Context, o *migrateNodeOptions) error {
	target, err := proxy.ParseTarget(o.to)
	if err != nil {
		return usageErrorf("--to: %w", err)
	}
	if target.Mode == proxy.ModeNone {
		return usage(migrate.ErrNoneByNodeSwitch)
	}
	if o.output != "text" && o.output != "json" {
		return usageErrorf("--output %q: want text or json", o.output)
	}
	err = a.switchNode(ctx, o, target)
	if o.output == "json" {
		a.jsonResult(err)
	}
	return err
}

// switchNode runs kp migrate node's switch once its flags are checked.
func (a *app) switchNode(ctx context.Context, o *migrateNodeOptions, target proxy.Target) error {
	// Until kp names its node, the host's name (or the namespace's) is the
	// best guess.
	node, _ := a.hostname()
	if o.node.netns != "" {
		node = "in " + o.node.netns
	}
	src, err := o.node.open()
	if err != nil {
		return migrate.NodeError(node, "plan", err)
	}
	defer src.Close()
	sw := &migrate.NodeSwitch{Node: nodeSwitchSource{src, a.inventory}, Target: target, DryRun: o.dryRun, Timeout: o.timeout,
		Out: a.stdout, JSON: o.output == "json", Name: node}
	return refusedSwitch(sw.Run(ctx))
}

// nodeSwitchSource is a node's kp as migrate.NodeSwitch reads it.
type nodeSwitchSource struct {
	*nodeSource
	list func(*nodeSource, context.Context) ([]migrate.Found, error)
}

func (s nodeSwitchSource) RequestMigration(ctx context.Context, req statusapi.MigrationRequest) (*statusapi.Migration, error) {
	return s.client.RequestMigration(ctx, req)
}

func (s nodeSwitchSource) Migration(ctx context.Context) (*statusapi.Migration, error) {
	m, err := s.client.Migration(ctx)
	if err != nil {
		return nil, s.apiHint(err)
	}
	return m, nil
}

func (s nodeSwitchSource) Inventory(ctx context.Context) ([]migrate.Found, error) {
	return s.list(s.nodeSource, ctx)
}

// inventory lists what programs Services inside the node's namespace.
func (s *nodeSource) inventory(ctx context.Context) ([]migrate.Found, error) {
	var found []migrate.Found
	err := nsenter.RunFd(s.fd, func() (err error) {
		found, err = migrate.Inventory(ctx)
		return err
	})
	return found, permissionHint(err)
}
