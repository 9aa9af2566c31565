package migrate

import (
	"context"
	"testing"
	"time"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// detectingBackend is a backend whose drift detector the test drives: it
// reports what is sent on drifts, and says on stopped when it stops.
type detectingBackend struct {
	mode    proxy.Mode
	drifts  chan proxy.Drift
	started chan func(proxy.Drift)
	stopped chan struct{}
}

func newDetectingBackend(m proxy.Mode) *detectingBackend {
	return &detectingBackend{mode: m, drifts: make(chan proxy.Drift), started: make(chan func(proxy.Drift), 1),
		stopped: make(chan struct{})}
}

func (b *detectingBackend) Mode() proxy.Mode                         { return b.mode }
func (b *detectingBackend) Probe(context.Context) error              { return nil }
func (b *detectingBackend) Cleanup(context.Context) error            { return nil }
func (b *detectingBackend) Sync(context.Context, *proxy.State) error { return nil }

func (b *detectingBackend) DetectDrift(ctx context.Context, drifted func(proxy.Drift)) error {
	b.started <- drifted
	<-ctx.Done()
	close(b.stopped)
	return nil
}

// TestSwitcherRunsTheDriftDetectorOfTheModeThatRuns: the detector of the
// mode kp started in reports through the Switcher; a switch stops it,
// drops what it reports afterwards (the old mode's rules being removed is
// no drift), and starts the new mode's.
func TestSwitcherRunsTheDriftDetectorOfTheModeThatRuns(t *testing.T) {
	nft, ipt := newDetectingBackend(proxy.ModeNFTables), newDetectingBackend(proxy.ModeIPTables)
	s := NewSwitcher(SwitcherConfig{
		Initial: nft, InitialTarget: proxy.Target{Mode: proxy.ModeNFTables},
		Build: func(_ context.Context, t proxy.Target) (proxy.Backend, proxy.Target, error) {
			return ipt, t, nil
		},
		Retire: func(context.Context, proxy.Target, *proxy.State, bool) (int, error) { return 0, nil },
		Verify: func(context.Context, *proxy.State, proxy.Backend) (*statusapi.Verification, error) {
			return &statusapi.Verification{ServicePorts: 1}, nil
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	reported := make(chan proxy.Drift, 10)
	done := make(chan error, 1)
	go func() { done <- s.DetectDrift(ctx, func(d proxy.Drift) { reported <- d }) }()

	nftReport := receive(t, nft.started, "the nftables detector started")
	nftReport(proxy.Drift{What: "ip kp: flushed chain svc-web"})
	if d := receive(t, reported, "the nftables drift reported"); d.What != "ip kp: flushed chain svc-web" {
		t.Errorf("reported %+v", d)
	}

	if err := s.Sync(ctx, &proxy.State{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Request(proxy.Target{Mode: proxy.ModeIPTables, IPTablesBackend: "nft"}, "test"); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(ctx, &proxy.State{}); err != nil {
		t.Fatal(err)
	}
	receive(t, nft.stopped, "the nftables detector stopped at the switch")
	nftReport(proxy.Drift{What: "ip kp: deleted table"})
	iptReport := receive(t, ipt.started, "the iptables detector started")
	iptReport(proxy.Drift{What: "nat KP-SERVICES: 0 rules, kp wrote 4"})
	if d := receive(t, reported, "the iptables drift reported"); d.What != "nat KP-SERVICES: 0 rules, kp wrote 4" {
		t.Errorf("reported %+v, want the iptables mode's only (the old mode's dropped)", d)
	}
	cancel()
	receive(t, done, "DetectDrift returned")
	receive(t, ipt.stopped, "the iptables detector stopped")
}

func receive[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: not within 5s", what)
		var zero T
		return zero
	}
}
