package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/kpproxy/kp/conntrack"
	"github.com/kpproxy/kp/internal/nsenter"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// nodeSource reads what kp flows and kp top show: kp proxy's status API on
// its root-only Unix socket, and the local addresses and conntrack table
// of one network namespace. It is kp top's tui.Source.
type nodeSource struct {
	fd     int // 0: the caller's own namespace
	netns  string
	socket string
	client *statusapi.Client
}

// nodeFlags are the flags of the commands that read a node's kp (flows,
// top, status, migrate node): which network namespace, and kp proxy's
// status socket.
type nodeFlags struct {
	netns        string
	statusSocket string
}

// bind adds --netns (described by netnsHelp; none when empty) and
// --status-socket to fs.
func (f *nodeFlags) bind(fs *pflag.FlagSet, netnsHelp string) {
	if netnsHelp != "" {
		fs.StringVar(&f.netns, "netns", "", netnsHelp+": a name from 'ip netns' or a path such as /proc/PID/ns/net")
	}
	fs.StringVar(&f.statusSocket, "status-socket", statusapi.DefaultSocket,
		"kp proxy's status socket (its --status-socket); only root opens it. From the host, with kp in a pod: "+
			"/proc/<kp's pid>/root"+statusapi.DefaultSocket)
}

// open is openNodeSource for the flags.
func (f *nodeFlags) open() (*nodeSource, error) { return openNodeSource(f.netns, f.statusSocket) }

// openNodeSource opens the namespace netns ("" for the caller's own) and
// points at the status API on the socket.
func openNodeSource(netns, socket string) (*nodeSource, error) {
	s := &nodeSource{netns: netns, socket: socket}
	if netns != "" {
		var err error
		if s.fd, err = nsenter.Open(netns); err != nil {
			return nil, err
		}
	}
	s.client = statusapi.SocketClient(socket)
	return s, nil
}

func (s *nodeSource) Close() {
	if s.fd > 0 {
		unix.Close(s.fd)
	}
}

// apiHint says what to check when the status API does not answer.
func (s *nodeSource) apiHint(err error) error {
	hint := "is kp proxy running, with --status-socket " + s.socket + "? see --status-socket"
	if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
		hint = "only root on the node opens kp's status socket: run as root, or kubectl exec into kp's pod"
	}
	return fmt.Errorf("%w (%s)", err, hint)
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

// Snapshot reads kp proxy's snapshot, for kp explain, kp snapshot and kp
// top's explain view.
func (s *nodeSource) Snapshot(ctx context.Context) (*statusapi.Snapshot, error) {
	snap, err := s.client.Snapshot(ctx)
	if err != nil {
		return nil, s.apiHint(err)
	}
	if snap.Format != statusapi.SnapshotFormat {
		return nil, fmt.Errorf("the kp proxy on %s answered no snapshot (format %q): is it an older kp? "+
			"Its status API has no %s", s.socket, snap.Format, statusapi.SnapshotPath)
	}
	return snap, nil
}
