package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/kpproxy/kp/tui"
)

type topOptions struct {
	node    nodeFlags
	refresh time.Duration
}

func newTopCommand(a *app) *cobra.Command {
	o := &topOptions{}
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Live view of Services, their endpoints' share of connections, and flows",
		Long: `kp top is a live terminal view of the node's Services (also run as kp-top).

The start screen lists every Service port with its addresses, endpoints ready, new
connections per second, active flows, GONE/UNR (flows pinned to endpoints that are
gone / UDP entries never answered, the row highlighted) and bytes per second. enter
opens a Service port: its endpoints with node, zone, hints and state, WHY each is or
is not chosen (kp explain's reasons), EXPECT/SEEN (the share kp's selection gives it
and the share seen since that selection; ! where they differ beyond chance), each
one's share over the last interval and since kp began counting it, and the
Service's flows. :flows shows the node's conntrack table attributed to Services and
endpoints. x on a Service or a flow opens kp explain's answer for it.

Keys as in k9s: ? help, / filter (a regular expression; esc clears), : command
(:svc, :flows), enter drill down, x explain, esc back, q or ctrl-c quit; the help
lists the sort keys of each view. NO_COLOR turns colours off.

It reads kp proxy's status API (on its root-only socket, --status-socket) and the conntrack table
of the network namespace it runs in, or the one given with --netns; when either
cannot be reached it says so and keeps trying. Needs root (CAP_NET_ADMIN) for
conntrack.`,
		Example: `  # On the node (or: kubectl exec -it -n kube-system <kp pod> -- kp-top)
  kp top

  # kp proxy runs in the network namespace node-1 (ip netns add node-1)
  kp top --netns node-1 --refresh 5s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.refresh < 100*time.Millisecond {
				return usageErrorf("--refresh %s: want at least 100ms", o.refresh)
			}
			if !isTerminal(a.stdout) {
				return fmt.Errorf("kp top needs a terminal: run it with 'kubectl exec -it' or 'ssh -t' (kp flows lists flows without one)")
			}
			src, err := o.node.open()
			if err != nil {
				return err
			}
			defer src.Close()
			return tui.Run(cmd.Context(), tui.Config{
				Source:  src,
				Refresh: o.refresh,
				Color:   a.getenv("NO_COLOR") == "",
				// The explain view's path through the mode's rules.
				RulePaths: rulePathers,
			})
		},
	}
	fs := cmd.Flags()
	o.node.bind(fs, "read from this network namespace")
	fs.DurationVar(&o.refresh, "refresh", 2*time.Second, "how often to read the status API and the conntrack table")
	return cmd
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
