package tui

import (
	"context"
	"net/netip"
	"time"

	tea "charm.land/bubbletea/v2"

	"github.com/kpproxy/kp/conntrack"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// Source is where kp top reads: kp proxy's status API and the conntrack
// table of the network namespace kp proxy runs in.
type Source interface {
	Status(ctx context.Context) (*statusapi.Status, error)
	Services(ctx context.Context) (*statusapi.Services, error)
	// LocalAddrs are the namespace's addresses (NodePorts answer on all).
	LocalAddrs() ([]netip.Addr, error)
	DumpFlows() ([]conntrack.Flow, error)
	// WatchFlows streams conntrack events until ctx is done (nil) or the
	// stream breaks (an error).
	WatchFlows(ctx context.Context, events chan<- conntrack.Event) error
	// Snapshot reads kp proxy's snapshot (GET /kp/v1/snapshot): what kp
	// explain answers from, read when an explanation is asked for.
	Snapshot(ctx context.Context) (*statusapi.Snapshot, error)
}

// tickMsg says it is time to read again.
type tickMsg time.Time

// fetch reads everything once. A failure of one side does not stop the
// other: the status API may be down while conntrack answers.
func fetch(src Source, timeout time.Duration, now func() time.Time) tea.Cmd {
	return func() tea.Msg {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		var m snapshotMsg
		m.Status, m.StatusErr = src.Status(ctx)
		if m.StatusErr == nil {
			m.Services, m.StatusErr = src.Services(ctx)
		}
		m.Local, m.FlowsErr = src.LocalAddrs()
		if m.FlowsErr == nil {
			m.Flows, m.FlowsErr = src.DumpFlows()
		}
		m.At = now()
		return m
	}
}

// listen waits for the next message of the event stream; Update calls it
// again after each, so exactly one listen is pending at a time.
func listen(ch <-chan tea.Msg) tea.Cmd {
	if ch == nil {
		return nil
	}
	return func() tea.Msg { return <-ch }
}

// minRetry is the least wait before the event stream is opened again.
const minRetry = time.Second

// maxBatch bounds how many events one message carries: a burst is applied
// and drawn once rather than per event.
const maxBatch = 512

// streamFlows runs src's event stream into out until ctx is done,
// restarting it retry after it breaks. Events are batched as they queue up.
func streamFlows(ctx context.Context, src Source, out chan<- tea.Msg, retry time.Duration) {
	send := func(m tea.Msg) bool {
		select {
		case out <- m:
			return true
		case <-ctx.Done():
			return false
		}
	}
	for ctx.Err() == nil {
		events := make(chan conntrack.Event, maxBatch)
		errc := make(chan error, 1)
		wctx, cancel := context.WithCancel(ctx)
		go func() { errc <- src.WatchFlows(wctx, events) }()
		var err error
	recv:
		for {
			select {
			case ev := <-events:
				batch := flowEventsMsg{ev}
			more:
				for len(batch) < maxBatch {
					select {
					case ev := <-events:
						batch = append(batch, ev)
					default:
						break more
					}
				}
				if !send(batch) {
					break recv
				}
			case err = <-errc:
				break recv
			}
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil && !send(watchErrMsg{err}) {
			return
		}
		select {
		case <-time.After(retry):
		case <-ctx.Done():
			return
		}
	}
}
