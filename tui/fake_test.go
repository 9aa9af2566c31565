package tui

import (
	"context"
	"errors"
	"net/netip"
	"regexp"

	"github.com/kpproxy/kp/conntrack"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// fakeSource answers from memory and counts reads.
type fakeSource struct {
	svcs  *statusapi.Services
	flows []conntrack.Flow
	reads int
	// snap answers Snapshot; nil is an error.
	snap *statusapi.Snapshot
}

func (f *fakeSource) Snapshot(context.Context) (*statusapi.Snapshot, error) {
	if f.snap == nil {
		return nil, errors.New("no snapshot")
	}
	return f.snap, nil
}

func (f *fakeSource) Status(context.Context) (*statusapi.Status, error) {
	f.reads++
	return status(), nil
}
func (f *fakeSource) Services(context.Context) (*statusapi.Services, error) { return f.svcs, nil }
func (f *fakeSource) LocalAddrs() ([]netip.Addr, error)                     { return nil, nil }
func (f *fakeSource) DumpFlows() ([]conntrack.Flow, error)                  { return f.flows, nil }
func (f *fakeSource) WatchFlows(ctx context.Context, _ chan<- conntrack.Event) error {
	<-ctx.Done()
	return nil
}

// sgrColour matches an SGR sequence that sets a foreground or background
// colour.
var sgrColour = regexp.MustCompile(`\x1b\[(?:[0-9;]*;)?(?:3[0-8]|4[0-8]|9[0-7]|10[0-7])(?:;[0-9;]*)?m`)
