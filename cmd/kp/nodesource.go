package main

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/kpproxy/kp/conntrack"
	"github.com/kpproxy/kp/internal/nsenter"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/server"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// nodeSource reads what kp flows and kp top show, inside one network
// namespace: kp proxy's status API on that namespace's loopback, its local
// addresses and its conntrack table. It is kp top's tui.Source.
type nodeSource struct {
	fd     int // 0: the caller's own namespace
	netns  string
	addr   string
	client *statusapi.Client
}

// nodeFlags are the flags of the commands that read a node's kp (flows,
// top, migrate node): which network namespace, and where in it kp proxy
// serves its status API.
type nodeFlags struct {
	netns         string
	statusAddress string
}

// bind adds --netns (described by netnsHelp) and --status-address to fs.
func (f *nodeFlags) bind(fs *pflag.FlagSet, netnsHelp string) {
	fs.StringVar(&f.netns, "netns", "", netnsHelp+": a name from 'ip netns' or a path such as /proc/PID/ns/net")
	fs.StringVar(&f.statusAddress, "status-address", server.DefaultMetricsBindAddress,
		"kp proxy's metrics address (--metrics-bind-address), where its status API is served on the node's loopback")
}

// open is openNodeSource for the flags.
func (f *nodeFlags) open() (*nodeSource, error) { return openNodeSource(f.netns, f.statusAddress) }

// openNodeSource opens the namespace netns ("" for the caller's own) and
// points at the status API on addr.
func openNodeSource(netns, addr string) (*nodeSource, error) {
	s := &nodeSource{netns: netns, addr: addr}
	if netns != "" {
		var err error
		if s.fd, err = nsenter.Open(netns); err != nil {
			return nil, err
		}
	}
	s.client = &statusapi.Client{
		BaseURL: "http://" + addr,
		HTTP:    &http.Client{Transport: &http.Transport{DialContext: nsenter.DialContextFd(s.fd), Proxy: nil}},
	}
	return s, nil
}

func (s *nodeSource) Close() {
	if s.fd > 0 {
		unix.Close(s.fd)
	}
}

// apiHint says what to check when the status API does not answer.
func (s *nodeSource) apiHint(err error) error {
	return fmt.Errorf("%w (is kp proxy running%s, with --metrics-bind-address %s? see --status-address)",
		err, where(s.netns), s.addr)
}

func (s *nodeSource) Status(ctx context.Context) (*statusapi.Status, error) {
	st, err := s.client.Status(ctx)
	if err != nil {
		return nil, s.apiHint(err)
	}
	return st, nil
}

// Services lists every Service port, for kp top.
func (s *nodeSource) Services(ctx context.Context) (*statusapi.Services, error) {
	return s.servicesOf(ctx, "", "")
}

// servicesOf lists the Service ports of a namespace and Service name when
// they are not empty.
func (s *nodeSource) servicesOf(ctx context.Context, namespace, service string) (*statusapi.Services, error) {
	svcs, err := s.client.Services(ctx, namespace, service)
	if err != nil {
		return nil, s.apiHint(err)
	}
	return svcs, nil
}

func (s *nodeSource) LocalAddrs() ([]netip.Addr, error) {
	var local []netip.Addr
	err := nsenter.RunFd(s.fd, func() error {
		var err error
		local, err = proxy.LocalAddrs()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list local addresses%s: %w", where(s.netns), err)
	}
	return local, nil
}

func (s *nodeSource) DumpFlows() ([]conntrack.Flow, error) {
	conn, err := conntrack.Dialer{NetNS: s.fd}.Open()
	if err != nil {
		return nil, permissionHint(err)
	}
	defer conn.Close()
	flows, err := conn.Dump()
	return flows, permissionHint(err)
}

func (s *nodeSource) WatchFlows(ctx context.Context, events chan<- conntrack.Event) error {
	return permissionHint(conntrack.Dialer{NetNS: s.fd}.Watch(ctx, events))
}
