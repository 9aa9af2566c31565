package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/kpproxy/kp/conntrack"
	"github.com/kpproxy/kp/proxy/statusapi"
)

type flowsOptions struct {
	namespace string
	service   string
	output    string
	node      nodeFlags
	timeout   time.Duration
}

func newFlowsCommand(a *app) *cobra.Command {
	o := &flowsOptions{}
	cmd := &cobra.Command{
		Use:   "flows",
		Short: "List the conntrack flows of Services, with the endpoint each goes to",
		Long: `List the node's conntrack flows that are addressed to a Service (ClusterIP, NodePort,
external IP or LoadBalancer IP), once, as a table or as JSON. Each flow is attributed to
its Service port by where the client sent it, and to an endpoint by where the kernel
sends it (its reply source), with the endpoint's condition in kp's last sync (ready,
serving, not-ready; gone when it is no endpoint any more; none when the flow was
never DNATed), the conntrack state, age, packets and bytes. Age, packets and bytes need
conntrack timestamps and accounting, which kp proxy turns on in its network namespace.

The Services come from the running kp proxy's status API (/kp/v1/services on its
root-only socket, --status-socket); the flows from the kernel of the network namespace kp flows runs in,
or the one given with --netns. Needs root (CAP_NET_ADMIN).`,
		Example: `  # Every Service flow on this node
  kp flows

  # The flows of one Service, as JSON
  kp flows -n kube-system --service kube-dns -o json

  # kp proxy runs in the network namespace node-1 (ip netns add node-1)
  kp flows --netns node-1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.output != "table" && o.output != "json" {
				return usageErrorf("--output %q: want table or json", o.output)
			}
			reports, err := a.flows(cmd.Context(), o)
			if err != nil {
				return err
			}
			if o.output == "json" {
				return writeFlowsJSON(a.stdout, reports)
			}
			return writeFlowsTable(a.stdout, reports)
		},
	}
	fs := cmd.Flags()
	fs.StringVarP(&o.namespace, "namespace", "n", "", "only flows of Services in this namespace")
	fs.StringVar(&o.service, "service", "", "only flows of the Service with this name")
	fs.StringVarP(&o.output, "output", "o", "table", "output format: table or json")
	o.node.bind(fs, "act in this network namespace")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "give up after this long")
	return cmd
}

// flows reads the Services from kp proxy and the flows from the kernel, in
// the chosen namespace, and attributes them.
func (a *app) flows(ctx context.Context, o *flowsOptions) ([]conntrack.FlowReport, error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	src, err := o.node.open()
	if err != nil {
		return nil, err
	}
	defer src.Close()
	svcs, err := src.servicesOf(ctx, o.namespace, o.service)
	if err != nil {
		return nil, err
	}
	st, err := statusapi.StateFromServices(svcs)
	if err != nil {
		return nil, fmt.Errorf("kp proxy's status API: %w", err)
	}
	local, err := src.LocalAddrs()
	if err != nil {
		return nil, err
	}
	flows, err := src.DumpFlows()
	if err != nil {
		return nil, err
	}
	// The status API already filtered the Services; flows of others are
	// simply not attributed.
	return conntrack.Reports(flows, conntrack.NewIndex(st, local), time.Now(), nil), nil
}

func where(netns string) string {
	if netns == "" {
		return " in this network namespace"
	}
	return " in network namespace " + netns
}

func permissionHint(err error) error {
	if errors.Is(err, unix.EPERM) {
		return fmt.Errorf("%w (reading conntrack needs root or CAP_NET_ADMIN)", err)
	}
	return err
}

func writeFlowsJSON(w io.Writer, reports []conntrack.FlowReport) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(reports)
}

func writeFlowsTable(w io.Writer, reports []conntrack.FlowReport) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tPROTO\tVIA\tCLIENT\tFRONTEND\tENDPOINT\tENDPOINT-STATE\tSTATE\tAGE\tPACKETS\tBYTES")
	for _, r := range reports {
		svc := r.Namespace + "/" + r.Service
		if r.PortName != "" {
			svc += ":" + r.PortName
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", svc, r.Protocol, r.Via, r.Client, r.Frontend,
			r.Endpoint, r.EndpointState, r.State, age(r.AgeSeconds), count(r.Packets), count(r.Bytes))
	}
	if len(reports) == 0 {
		fmt.Fprintln(tw, "(no flows to Services)")
	}
	return tw.Flush()
}

func age(s *float64) string {
	if s == nil {
		return "-"
	}
	d := time.Duration(*s * float64(time.Second))
	if d < time.Hour {
		return d.Round(time.Second).String()
	}
	return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
}

func count(n *uint64) string {
	if n == nil {
		return "-"
	}
	return fmt.Sprint(*n)
}
