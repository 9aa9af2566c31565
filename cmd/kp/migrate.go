package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

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
MODE afterwards.`,
		Example: `  # On the node, as root: the plan only
  kp migrate node --to iptables --dry-run

  # Switch to the iptables mode with the iptables-legacy binaries
  kp migrate node --to iptables-legacy

  # kp runs in the network namespace node-1 (ip netns add node-1)
  kp migrate node --netns node-1 --to nftables

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
	_ = cmd.MarkFlagRequired("to")
	return cmd
}

// migrateError names the node and the step that failed.
func migrateError(node, step string, err error) error {
	if node == "" {
		node = "(unknown)"
	}
	return fmt.Errorf("migrate node %s: step %s: %w", node, step, err)
}

func (a *app) migrateNode(ctx context.Context, o *migrateNodeOptions) error {
	target, err := proxy.ParseTarget(o.to)
	if err != nil {
		return fmt.Errorf("--to: %w", err)
	}
	if target.Mode == proxy.ModeNone {
		return errors.New("--to none: the none mode removes kp's rules and programs nothing; it is kp migrate cluster --rollback's, for handing a node back to kube-proxy")
	}
	// Until kp names its node, the host's name (or the namespace's) is the
	// best guess.
	node, _ := a.hostname()
	if o.node.netns != "" {
		node = "in " + o.node.netns
	}
	src, err := o.node.open()
	if err != nil {
		return migrateError(node, "plan", err)
	}
	defer src.Close()
	st, err := src.Status(ctx)
	if err != nil {
		return migrateError(node, "plan", err)
	}
	node = st.Node
	found, err := a.inventory(ctx, src)
	if err != nil {
		return migrateError(node, "plan", err)
	}
	running := runningTarget(st)
	p := newPlan(st, running, target, found)
	p.print(a.stdout)
	if p.nothing() {
		fmt.Fprintf(a.stdout, "\nNothing to do: kp runs %s and nothing else programs Services on %s.\n", running, node)
		return nil
	}
	if o.dryRun {
		fmt.Fprintln(a.stdout, "\nDry run: nothing changed.")
		return nil
	}

	fmt.Fprintf(a.stdout, "\nMigrating node %s to %s:\n", node, target)
	var id uint64
	if m := st.Migration; m != nil && m.To == target.String() &&
		(m.Phase == statusapi.MigrationPending || m.Phase == statusapi.MigrationRunning) {
		// A re-run while the switch it asked for goes on: follow it.
		fmt.Fprintf(a.stdout, "  (a switch to %s asked by %s is under way; following it)\n", m.To, m.RequestedBy)
		id = m.ID
	} else {
		mig, err := src.client.RequestMigration(ctx, statusapi.MigrationRequest{To: target.String(), RequestedBy: "kp migrate node"})
		if err != nil {
			return migrateError(node, "request", err)
		}
		id = mig.ID
	}
	final, err := a.follow(ctx, src, id, o.timeout)
	if err != nil {
		return migrateError(node, "wait", err)
	}
	if final.Phase == statusapi.MigrationFailed {
		step := "program"
		for _, s := range final.Steps {
			if s.Error != "" {
				step = s.Name
			}
		}
		return migrateError(node, step, errors.New(final.Error))
	}

	left, err := a.inventory(ctx, src)
	if err != nil {
		return migrateError(node, "report", err)
	}
	fmt.Fprintf(a.stdout, "\nNode %s now runs kp %s. Programming its Services:\n", node, final.To)
	printFound(a.stdout, left)
	var stale []string
	for _, f := range left {
		// IPVS virtual servers that connections (established, or UDP
		// flows IPVS tracks) still use stay until those end (kp removes
		// them then).
		if !f.Is("kp", target) && !(final.KeptForConnections > 0 && f.Mode == "ipvs") {
			stale = append(stale, f.Owner+" "+f.Mode+" in "+f.Where)
		}
	}
	if n := final.KeptForConnections; n > 0 {
		fmt.Fprintf(a.stdout, "\n%d IPVS virtual servers stay while their connections last (IPVS drops a\n"+
			"connection's packets once its virtual server is gone); kp removes them when those connections end.\n", n)
	}
	if len(stale) > 0 {
		return migrateError(node, "remove", fmt.Errorf("still on the node: %s (re-run to retry)", strings.Join(stale, "; ")))
	}
	fmt.Fprintf(a.stdout, "\nTo keep %s across kp restarts, annotate the Node: kubectl annotate node %s %s=%s --overwrite\n",
		final.To, node, proxy.AnnotationProxyMode, final.To)
	return nil
}

// follow polls the migration with id until it ends, printing each step as
// it finishes.
func (a *app) follow(ctx context.Context, src *nodeSource, id uint64, timeout time.Duration) (*statusapi.Migration, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	printed := 0
	for {
		m, err := src.client.Migration(ctx)
		if err != nil {
			return nil, src.apiHint(err)
		}
		if m != nil && m.ID == id {
			for ; printed < len(m.Steps) && !m.Steps[printed].Ended.IsZero(); printed++ {
				s := m.Steps[printed]
				line := s.Detail
				if s.Error != "" {
					line = "FAILED: " + s.Error
				}
				fmt.Fprintf(a.stdout, "  %-8s %s (%s)\n", s.Name, line, s.Ended.Sub(s.Started).Round(time.Millisecond))
			}
			if m.Phase == statusapi.MigrationSucceeded || m.Phase == statusapi.MigrationFailed {
				if v := m.Verification; v != nil {
					for _, w := range v.Warnings {
						fmt.Fprintf(a.stdout, "  warning: %s\n", w)
					}
				}
				return m, nil
			}
		} else if m != nil && m.ID > id {
			return nil, fmt.Errorf("another switch (to %s, asked by %s) replaced this one", m.To, m.RequestedBy)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("kp did not finish the switch within %s", timeout)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// inventory lists what programs Services inside the node's namespace.
func (a *app) inventory(ctx context.Context, src *nodeSource) ([]migrate.Found, error) {
	var found []migrate.Found
	err := inNetns(src.fd, func() (err error) {
		found, err = migrate.Inventory(ctx)
		return err
	})
	return found, permissionHint(err)
}

// runningTarget is the mode kp reports it runs.
func runningTarget(st *statusapi.Status) proxy.Target {
	return proxy.Target{Mode: proxy.Mode(st.Mode), IPTablesBackend: st.IPTablesBackend}
}

func printFound(w io.Writer, found []migrate.Found) {
	if len(found) == 0 {
		fmt.Fprintln(w, "  (nothing)")
		return
	}
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	for _, f := range found {
		fmt.Fprintf(tw, "  %s %s\t%s\t%s\n", f.Owner, f.Mode, f.Where, f.Size())
	}
	_ = tw.Flush()
}
