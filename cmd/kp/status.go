package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/kpproxy/kp/proxy/statusapi"
)

type statusOptions struct {
	node      nodeFlags
	output    string
	inventory bool
}

func newStatusCommand(a *app) *cobra.Command {
	o := &statusOptions{}
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Print the status of the kp proxy on this node (mode, health, syncs, switches)",
		Long: `Print what the kp proxy running on this node reports: its mode and how it was
chosen, health, last sync and last error, the node settings it made, and the last
mode switch. With --inventory, what programs the node's Services in the kernel
(kp's rules and other proxies'). It reads kp proxy's status API on its Unix socket
(--status-socket), which only root on the node opens; from elsewhere, run it in
kp's pod with kubectl exec, so whoever may exec into kube-system's pods may read it.
kp migrate cluster reads each node this way.`,
		Example: `  # On the node, as root
  kp status

  # From anywhere, through the API server (RBAC: pods/exec in kube-system)
  kubectl exec -n kube-system <kp pod> -- kp status -o json
  kubectl exec -n kube-system <kp pod> -- kp status --inventory -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.output != "text" && o.output != "json" {
				return usageErrorf("--output %q: want text or json", o.output)
			}
			return a.status(cmd.Context(), o)
		},
	}
	fs := cmd.Flags()
	o.node.bind(fs, "")
	fs.StringVarP(&o.output, "output", "o", "text", "text, or json (the status API's body)")
	fs.BoolVar(&o.inventory, "inventory", false, "print the inventory (what programs the node's Services) instead")
	return cmd
}

func (a *app) status(ctx context.Context, o *statusOptions) error {
	src, err := o.node.open()
	if err != nil {
		return err
	}
	defer src.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var body any
	if o.inventory {
		inv, err := src.client.Inventory(ctx)
		if err != nil {
			return src.apiHint(err)
		}
		body = inv
		if o.output == "text" {
			printInventory(a.stdout, inv)
			return nil
		}
	} else {
		st, err := src.Status(ctx)
		if err != nil {
			return err
		}
		body = st
		if o.output == "text" {
			printStatus(a.stdout, st)
			return nil
		}
	}
	enc := json.NewEncoder(a.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(body)
}

func printStatus(w io.Writer, st *statusapi.Status) {
	fmt.Fprintf(w, "node:     %s\nmode:     %s\nhealthy:  %v\nstarted:  %s\n", st.Node, st.Mode, st.Healthy, st.StartTime.Format(time.RFC3339))
	if b := st.Build; b != nil {
		fmt.Fprintf(w, "version:  %s (commit %s, built %s, %s %s)\n", b.Version, b.Commit, b.BuildDate, b.GoVersion, b.Platform)
	}
	fmt.Fprintf(w, "services: %d service ports, %d endpoints\n", st.ServicePorts, st.Endpoints)
	fmt.Fprintf(w, "syncs:    %d succeeded (%d full), %d failed\n", st.Syncs.Succeeded, st.Syncs.Full, st.Syncs.Failed)
	if st.LastSync != nil {
		fmt.Fprintf(w, "last sync: %s (%.3fs)\n", st.LastSync.Time.Format(time.RFC3339), st.LastSync.DurationSeconds)
	}
	if st.LastError != nil {
		fmt.Fprintf(w, "last error: %s: %s\n", st.LastError.Time.Format(time.RFC3339), st.LastError.Message)
	}
	if m := st.Migration; m != nil {
		fmt.Fprintf(w, "switch:   %s -> %s: %s\n", m.From, m.To, m.Phase)
	}
}

func printInventory(w io.Writer, inv *statusapi.Inventory) {
	fmt.Fprintf(w, "node %s, read %s\n", inv.Node, inv.Time.Format(time.RFC3339))
	for _, p := range inv.Programs {
		fmt.Fprintf(w, "  %s %s in %s: %d chains, %d rules\n", p.Owner, p.Mode, p.Where, p.Chains, p.Rules)
	}
	if inv.Error != "" {
		fmt.Fprintf(w, "error: %s\n", inv.Error)
	}
}
