package main

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/kpproxy/kp/conntrack"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
	"github.com/kpproxy/kp/tui"
)

type topOptions struct {
	netns         string
	statusAddress string
	refresh       time.Duration
}

func newTopCommand(a *app) *cobra.Command {
	o := &topOptions{}
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Live view of Services, their endpoints' share of connections, and flows",
		Long: `kp top is a live terminal view of the node's Services (also run as kp-top).

The start screen lists every Service port with its addresses, endpoints ready, new
connections per second, active flows and bytes per second. enter opens a Service
port: its endpoints with node, zone and state, each one's share of new connections
over the last interval and since kp began counting it, and the Service's flows.
:flows shows the node's conntrack table attributed to Services and endpoints.

Keys as in k9s: ? help, / filter (a regular expression; esc clears), : command
(:svc, :flows), enter drill down, esc back, q or ctrl-c quit; the help lists the
sort keys of each view. NO_COLOR turns colours off.

It reads kp proxy's status API (on its metrics address) and the conntrack table
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
				return fmt.Errorf("--refresh %s: want at least 100ms", o.refresh)
			}
			src, err := newTopSource(o)
			if err != nil {
				return err
			}
			defer src.Close()
			return tui.Run(cmd.Context(), tui.Config{
				Source:  src,
				Refresh: o.refresh,
				Color:   a.getenv("NO_COLOR") == "",
			})
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.netns, "netns", "", "read from this network namespace: a name from 'ip netns' or a path such as /proc/PID/ns/net")
	fs.StringVar(&o.statusAddress, "status-address", proxy.DefaultMetricsBindAddress,
		"kp proxy's metrics address (--metrics-bind-address), where its status API is served")
	fs.DurationVar(&o.refresh, "refresh", 2*time.Second, "how often to read the status API and the conntrack table")
	return cmd
}

// topSource reads kp top's data inside one network namespace.
type topSource struct {
	fd     int
	where  string
	addr   string
	client *statusapi.Client
}

func newTopSource(o *topOptions) (*topSource, error) {
	s := &topSource{where: where(o.netns), addr: o.statusAddress}
	if o.netns != "" {
		var err error
		if s.fd, err = openNetns(o.netns); err != nil {
			return nil, err
		}
	}
	s.client = &statusapi.Client{
		BaseURL: "http://" + o.statusAddress,
		HTTP:    &http.Client{Transport: &http.Transport{DialContext: dialerIn(s.fd), Proxy: nil}},
	}
	return s, nil
}

func (s *topSource) Close() {
	if s.fd > 0 {
		unix.Close(s.fd)
	}
}

func (s *topSource) hint(err error) error {
	return fmt.Errorf("%w (is kp proxy running%s, with --metrics-bind-address %s?)", err, s.where, s.addr)
}

func (s *topSource) Status(ctx context.Context) (*statusapi.Status, error) {
	st, err := s.client.Status(ctx)
	if err != nil {
		return nil, s.hint(err)
	}
	return st, nil
}

func (s *topSource) Services(ctx context.Context) (*statusapi.Services, error) {
	svcs, err := s.client.Services(ctx, "", "")
	if err != nil {
		return nil, s.hint(err)
	}
	return svcs, nil
}

func (s *topSource) LocalAddrs() ([]netip.Addr, error) {
	var local []netip.Addr
	err := inNetns(s.fd, func() error {
		var err error
		local, err = conntrack.LocalAddrs()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list local addresses%s: %w", s.where, err)
	}
	return local, nil
}

func (s *topSource) DumpFlows() ([]conntrack.Flow, error) {
	conn, err := conntrack.Dialer{NetNS: s.fd}.Open()
	if err != nil {
		return nil, permissionHint(err)
	}
	defer conn.Close()
	flows, err := conn.Dump()
	return flows, permissionHint(err)
}

func (s *topSource) WatchFlows(ctx context.Context, events chan<- conntrack.Event) error {
	return permissionHint(conntrack.Dialer{NetNS: s.fd}.Watch(ctx, events))
}
