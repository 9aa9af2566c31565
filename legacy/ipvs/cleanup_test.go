package ipvs

import (
	"errors"
	"testing"

	"github.com/moby/ipvs"
	"golang.org/x/sys/unix"
)

// destsOf is a Handle that only lists real servers.
type destsOf struct {
	Handle
	dests []*ipvs.Destination
	err   error
}

func (h destsOf) GetDestinations(*ipvs.Service) ([]*ipvs.Destination, error) { return h.dests, h.err }

// A switch away from the ipvs mode keeps a virtual server while IPVS alone
// can serve its connections: established TCP ones, and UDP flows IPVS
// still tracks (counted inactive: UDP has no states). Deleting a UDP one
// under a live flow made IPVS drop the flow's next packet.
func TestInUseKeepsEstablishedConnectionsAndTrackedUDPFlows(t *testing.T) {
	dest := func(active, inactive int) *ipvs.Destination {
		return &ipvs.Destination{ActiveConnections: active, InactiveConnections: inactive}
	}
	for _, c := range []struct {
		name  string
		proto uint16
		h     destsOf
		want  bool
	}{
		{"TCP, an established connection", unix.IPPROTO_TCP, destsOf{dests: []*ipvs.Destination{dest(0, 3), dest(1, 0)}}, true},
		{"TCP, only closing connections", unix.IPPROTO_TCP, destsOf{dests: []*ipvs.Destination{dest(0, 3)}}, false},
		{"SCTP, an established association", unix.IPPROTO_SCTP, destsOf{dests: []*ipvs.Destination{dest(2, 0)}}, true},
		{"UDP, a tracked flow", unix.IPPROTO_UDP, destsOf{dests: []*ipvs.Destination{dest(0, 0), dest(0, 1)}}, true},
		{"UDP, no flow", unix.IPPROTO_UDP, destsOf{dests: []*ipvs.Destination{dest(0, 0)}}, false},
		{"no real server", unix.IPPROTO_UDP, destsOf{}, false},
		{"unreadable: kept, to be looked at again", unix.IPPROTO_TCP, destsOf{err: errors.New("netlink: i/o timeout")}, true},
	} {
		if got := InUse(c.h, &ipvs.Service{Protocol: c.proto}); got != c.want {
			t.Errorf("%s: InUse = %v, want %v", c.name, got, c.want)
		}
	}
}
