package migrate

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// recBackend records what the Switcher asked of it, in one shared log.
type recBackend struct {
	mode proxy.Mode
	log  *[]string
}

func (b *recBackend) Mode() proxy.Mode            { return b.mode }
func (b *recBackend) Probe(context.Context) error { return nil }
func (b *recBackend) Cleanup(context.Context) error {
	*b.log = append(*b.log, string(b.mode)+" cleanup")
	return nil
}
func (b *recBackend) Sync(context.Context, *proxy.State) error {
	*b.log = append(*b.log, string(b.mode)+" sync")
	return nil
}

func newTestSwitcher(log *[]string, verifyErr error) *Switcher {
	initial := &recBackend{mode: proxy.ModeNFTables, log: log}
	return NewSwitcher(SwitcherConfig{
		Initial: initial, InitialTarget: proxy.Target{Mode: proxy.ModeNFTables},
		Build: func(_ context.Context, t proxy.Target) (proxy.Backend, proxy.Target, error) {
			*log = append(*log, "build "+t.String())
			return &recBackend{mode: t.Mode, log: log}, t, nil
		},
		Retire: func(_ context.Context, running proxy.Target, _ *proxy.State, _ bool) (int, error) {
			*log = append(*log, "retire all but "+running.String())
			return 0, nil
		},
		Verify: func(_ context.Context, _ *proxy.State, b proxy.Backend) (*statusapi.Verification, error) {
			*log = append(*log, "verify "+string(b.Mode()))
			if verifyErr != nil {
				return &statusapi.Verification{Failed: []string{verifyErr.Error()}}, nil
			}
			return &statusapi.Verification{ServicePorts: 1}, nil
		},
	})
}

func TestSwitcherProgramsVerifiesThenRemovesTheOldMode(t *testing.T) {
	for _, tc := range []struct {
		name      string
		to        string
		verifyErr error
		want      []string
		phase     string
		mode      proxy.Mode
	}{
		{name: "switch", to: "iptables-nft", phase: statusapi.MigrationSucceeded, mode: proxy.ModeIPTables,
			want: []string{"nftables sync", "build iptables-nft", "iptables sync", "verify iptables", "retire all but iptables-nft"}},
		{name: "verify fails: the new rules go, the old mode stays", to: "userspace", verifyErr: errors.New("no counters moved"),
			phase: statusapi.MigrationFailed, mode: proxy.ModeNFTables,
			want: []string{"nftables sync", "build userspace", "userspace sync", "verify userspace", "verify nftables", "userspace cleanup"}},
		{name: "the running mode: re-verify and remove leftovers", to: "nftables", phase: statusapi.MigrationSucceeded, mode: proxy.ModeNFTables,
			want: []string{"nftables sync", "verify nftables", "retire all but nftables"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var log []string
			s := newTestSwitcher(&log, tc.verifyErr)
			ctx := context.Background()
			if err := s.Sync(ctx, &proxy.State{}); err != nil {
				t.Fatal(err)
			}
			log = nil
			target, _ := proxy.ParseTarget(tc.to)
			if _, err := s.Request(target, "test"); err != nil {
				t.Fatal(err)
			}
			if err := s.Sync(ctx, &proxy.State{}); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(log, tc.want) {
				t.Errorf("calls\n%q\nwant\n%q", log, tc.want)
			}
			if m := s.Migration(); m.Phase != tc.phase || s.Mode() != tc.mode {
				t.Errorf("phase %s (%s), mode %s; want %s, %s", m.Phase, m.Error, s.Mode(), tc.phase, tc.mode)
			}
			// The next sync goes to the mode that runs, and only to it.
			log = nil
			_ = s.Sync(ctx, &proxy.State{})
			if want := []string{string(tc.mode) + " sync"}; !slices.Equal(log, want) {
				t.Errorf("next sync: %q, want %q", log, want)
			}
		})
	}
}

func TestSwitcherStartsInTheModeTheNodeAnnotationNames(t *testing.T) {
	var log []string
	s := newTestSwitcher(&log, nil)
	st := &proxy.State{Node: proxy.Node{Name: "n1", ProxyMode: "userspace"}}
	if err := s.Sync(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	want := []string{"build userspace", "userspace sync", "retire all but userspace"}
	if !slices.Equal(log, want) || s.Mode() != proxy.ModeUserspace {
		t.Errorf("calls %q (mode %s), want %q", log, s.Mode(), want)
	}
	// The same annotation later is no new request.
	log = nil
	_ = s.Sync(context.Background(), st)
	if !slices.Equal(log, []string{"userspace sync"}) {
		t.Errorf("second sync: %q", log)
	}
}

func TestSwitcherRefusesToSwitchBetweenIPTablesFlavors(t *testing.T) {
	var log []string
	s := newTestSwitcher(&log, nil)
	s.curTarget = proxy.Target{Mode: proxy.ModeIPTables, IPTablesBackend: "nft"}
	if _, err := s.Request(proxy.Target{Mode: proxy.ModeIPTables, IPTablesBackend: "legacy"}, "test"); err == nil {
		t.Error("switch from iptables-nft to iptables-legacy accepted")
	}
}

// A switch asked for while another is pending or running is refused with
// that one's number, target and state; once it ended, a new one is taken.
func TestSwitcherRefusesASwitchWhileAnotherIsUnderWay(t *testing.T) {
	var log []string
	s := newTestSwitcher(&log, nil)
	ctx := context.Background()
	_ = s.Sync(ctx, &proxy.State{})
	inVerify, release := make(chan struct{}), make(chan struct{})
	s.cfg.Verify = func(context.Context, *proxy.State, proxy.Backend) (*statusapi.Verification, error) {
		close(inVerify)
		<-release
		return &statusapi.Verification{ServicePorts: 1}, nil
	}
	if _, err := s.Request(proxy.Target{Mode: proxy.ModeIPTables, IPTablesBackend: "nft"}, "kp migrate node"); err != nil {
		t.Fatal(err)
	}
	refused := func(state string) {
		t.Helper()
		_, err := s.Request(proxy.Target{Mode: proxy.ModeUserspace}, "another")
		want := "switch 1 to iptables-nft (asked by kp migrate node) is " + state
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("a request while switch 1 is %s: %v, want it refused saying %q", state, err, want)
		}
		if m := s.Migration(); m.ID != 1 || m.To != "iptables-nft" {
			t.Errorf("the status shows switch %d to %s, want 1 to iptables-nft", m.ID, m.To)
		}
	}
	refused(statusapi.MigrationPending)
	done := make(chan error, 1)
	go func() { done <- s.Sync(ctx, &proxy.State{}) }()
	<-inVerify
	refused(statusapi.MigrationRunning)
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if m, err := s.Request(proxy.Target{Mode: proxy.ModeNFTables}, "after"); err != nil || m.ID != 2 {
		t.Errorf("a request after switch 1 ended: %v, %+v", err, m)
	}
}

func TestSwitcherRemovesRulesThatShadowTheRunningModeThenVerifiesAgain(t *testing.T) {
	var log []string
	s := newTestSwitcher(&log, nil)
	verifies := 0
	s.cfg.Verify = func(_ context.Context, _ *proxy.State, b proxy.Backend) (*statusapi.Verification, error) {
		verifies++
		log = append(log, "verify "+string(b.Mode()))
		if verifies == 1 { // kube-proxy's newer rules take the probes
			return &statusapi.Verification{Failed: []string{"web: counters did not move"}}, nil
		}
		return &statusapi.Verification{ServicePorts: 1}, nil
	}
	ctx := context.Background()
	_ = s.Sync(ctx, &proxy.State{})
	log = nil
	if _, err := s.Request(proxy.Target{Mode: proxy.ModeNFTables}, "test"); err != nil {
		t.Fatal(err)
	}
	_ = s.Sync(ctx, &proxy.State{})
	want := []string{"nftables sync", "verify nftables", "retire all but nftables", "verify nftables", "retire all but nftables"}
	if !slices.Equal(log, want) {
		t.Errorf("calls %q, want %q", log, want)
	}
	if m := s.Migration(); m.Phase != statusapi.MigrationSucceeded {
		t.Errorf("phase %s: %s", m.Phase, m.Error)
	}
}

// failingBackend fails its syncs while fail is set.
type failingBackend struct {
	recBackend
	fail bool
}

func (b *failingBackend) Sync(ctx context.Context, st *proxy.State) error {
	if b.fail {
		return errors.New("refused")
	}
	return b.recBackend.Sync(ctx, st)
}

func TestSwitcherCountsTheFirstSyncAndTheOneAfterAFailureFullForABackendThatCannotSay(t *testing.T) {
	var log []string
	b := &failingBackend{recBackend: recBackend{mode: proxy.ModeUserspace, log: &log}}
	s := NewSwitcher(SwitcherConfig{Initial: b, InitialTarget: proxy.Target{Mode: proxy.ModeUserspace},
		Retire: func(context.Context, proxy.Target, *proxy.State, bool) (int, error) { return 0, nil }})
	ctx, st := context.Background(), &proxy.State{}
	var got []bool
	sync := func() {
		if err := s.Sync(ctx, st); err == nil {
			got = append(got, s.LastSyncFull())
		}
	}
	sync()
	sync()
	b.fail = true
	sync()
	b.fail = false
	sync()
	sync()
	if want := []bool{true, false, true, false}; !slices.Equal(got, want) {
		t.Errorf("full after each successful sync = %v, want %v", got, want)
	}
}

// After a switch, what the old mode keeps for established connections
// (IPVS virtual servers) is looked at again at later syncs, every
// retireRetry, until nothing is kept; past the drain bound Retire is told
// to keep nothing.
func TestSwitcherRetiresWhatWasKeptForConnectionsAtLaterSyncs(t *testing.T) {
	var log []string
	clk := testingclock.NewFakeClock(time.Unix(1000, 0))
	active := 2 // the old mode's virtual servers with established connections
	s := newTestSwitcher(&log, nil)
	s.cfg.Clock, s.cfg.Drain = clk, time.Minute
	s.cfg.Retire = func(_ context.Context, running proxy.Target, _ *proxy.State, keep bool) (int, error) {
		log = append(log, fmt.Sprintf("retire all but %s keeping %v", running, keep))
		if keep {
			return active, nil
		}
		return 0, nil
	}
	ctx := context.Background()
	sync := func() []string {
		log = nil
		if err := s.Sync(ctx, &proxy.State{}); err != nil {
			t.Fatal(err)
		}
		return log
	}
	sync()
	if _, err := s.Request(proxy.Target{Mode: proxy.ModeIPTables, IPTablesBackend: "nft"}, "test"); err != nil {
		t.Fatal(err)
	}
	sync()
	if m := s.Migration(); m.Phase != statusapi.MigrationSucceeded || !strings.Contains(m.Steps[len(m.Steps)-1].Detail, "2 IPVS virtual servers kept") {
		t.Errorf("migration %+v", m)
	}
	if got := sync(); !slices.Equal(got, []string{"iptables sync"}) {
		t.Errorf("a sync before retireRetry: %q", got)
	}
	clk.Step(retireRetry)
	active = 1
	if got, want := sync(), []string{"iptables sync", "retire all but iptables-nft keeping true"}; !slices.Equal(got, want) {
		t.Errorf("a sync after retireRetry: %q, want %q", got, want)
	}
	clk.Step(time.Minute) // past the drain bound
	if got, want := sync(), []string{"iptables sync", "retire all but iptables-nft keeping false"}; !slices.Equal(got, want) {
		t.Errorf("a sync past the drain bound: %q, want %q", got, want)
	}
	clk.Step(retireRetry)
	if got := sync(); !slices.Equal(got, []string{"iptables sync"}) {
		t.Errorf("a sync once nothing is kept: %q", got)
	}
}

// A new mode that synced but proved no Service while the old mode took
// every probe is shadowed (the old mode's chains run first in the nat
// hooks): the old mode goes first, then the new one is proven; if it still
// proves nothing, the old mode is programmed again and the new one
// removed.
func TestSwitcherHandsOverFromAModeWhoseChainsComeFirst(t *testing.T) {
	for _, tc := range []struct {
		name        string
		newCarries  bool // once the old mode is gone
		want        []string
		phase       string
		mode        proxy.Mode
		failureText string
	}{
		{name: "shadowed", newCarries: true, phase: statusapi.MigrationSucceeded, mode: proxy.ModeIPTables,
			want: []string{"nftables sync", "build iptables-nft", "iptables sync", "verify iptables", "verify nftables",
				"retire all but iptables-nft", "verify iptables"}},
		{name: "broken", newCarries: false, phase: statusapi.MigrationFailed, mode: proxy.ModeNFTables,
			failureText: "nftables programmed again",
			want: []string{"nftables sync", "build iptables-nft", "iptables sync", "verify iptables", "verify nftables",
				"retire all but iptables-nft", "verify iptables", "build nftables", "nftables sync", "iptables cleanup"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var log []string
			s := newTestSwitcher(&log, nil)
			oldGone := false
			s.cfg.Retire = func(_ context.Context, running proxy.Target, _ *proxy.State, _ bool) (int, error) {
				log = append(log, "retire all but "+running.String())
				oldGone = running.Mode != proxy.ModeNFTables
				return 0, nil
			}
			s.cfg.Verify = func(_ context.Context, _ *proxy.State, b proxy.Backend) (*statusapi.Verification, error) {
				log = append(log, "verify "+string(b.Mode()))
				if b.Mode() == proxy.ModeNFTables || oldGone && tc.newCarries {
					return &statusapi.Verification{ServicePorts: 2}, nil
				}
				return &statusapi.Verification{Failed: []string{"web", "api"}}, nil
			}
			ctx := context.Background()
			_ = s.Sync(ctx, &proxy.State{})
			log = nil
			if _, err := s.Request(proxy.Target{Mode: proxy.ModeIPTables, IPTablesBackend: "nft"}, "test"); err != nil {
				t.Fatal(err)
			}
			_ = s.Sync(ctx, &proxy.State{})
			if !slices.Equal(log, tc.want) {
				t.Errorf("calls\n%q\nwant\n%q", log, tc.want)
			}
			m := s.Migration()
			if m.Phase != tc.phase || s.Mode() != tc.mode || !strings.Contains(m.Error, tc.failureText) {
				t.Errorf("phase %s (%s), mode %s; want %s, %s", m.Phase, m.Error, s.Mode(), tc.phase, tc.mode)
			}
		})
	}
}

// A new mode that proves some Services and not others is broken, not
// shadowed: the switch fails without touching the old mode.
func TestSwitcherDoesNotHandOverToAModeThatCarriesOnlySomeServices(t *testing.T) {
	var log []string
	s := newTestSwitcher(&log, nil)
	s.cfg.Verify = func(_ context.Context, _ *proxy.State, b proxy.Backend) (*statusapi.Verification, error) {
		log = append(log, "verify "+string(b.Mode()))
		if b.Mode() == proxy.ModeNFTables {
			return &statusapi.Verification{ServicePorts: 2}, nil
		}
		return &statusapi.Verification{ServicePorts: 1, Failed: []string{"api"}}, nil
	}
	ctx := context.Background()
	_ = s.Sync(ctx, &proxy.State{})
	log = nil
	if _, err := s.Request(proxy.Target{Mode: proxy.ModeIPTables, IPTablesBackend: "nft"}, "test"); err != nil {
		t.Fatal(err)
	}
	_ = s.Sync(ctx, &proxy.State{})
	want := []string{"nftables sync", "build iptables-nft", "iptables sync", "verify iptables", "iptables cleanup"}
	if !slices.Equal(log, want) || s.Mode() != proxy.ModeNFTables {
		t.Errorf("calls %q (mode %s), want %q", log, s.Mode(), want)
	}
}

// scopedBackend is a recBackend built with --nodeport-addresses.
type scopedBackend struct {
	recBackend
	cidrs []netip.Prefix
}

func (b *scopedBackend) NodePortScope() ([]netip.Prefix, bool) { return b.cidrs, len(b.cidrs) == 0 }

// The service health server's NodePort addresses follow the mode that
// runs; a mode without them (none) keeps the initial mode's.
func TestSwitcherNodePortScopeIsTheRunningModes(t *testing.T) {
	var log []string
	iptCIDRs := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	s := NewSwitcher(SwitcherConfig{
		Initial:       &scopedBackend{recBackend: recBackend{mode: proxy.ModeNFTables, log: &log}},
		InitialTarget: proxy.Target{Mode: proxy.ModeNFTables},
		Build: func(_ context.Context, t proxy.Target) (proxy.Backend, proxy.Target, error) {
			if t.Mode == proxy.ModeNone {
				return &recBackend{mode: t.Mode, log: &log}, t, nil
			}
			return &scopedBackend{recBackend: recBackend{mode: t.Mode, log: &log}, cidrs: iptCIDRs}, t, nil
		},
		Retire: func(context.Context, proxy.Target, *proxy.State, bool) (int, error) { return 0, nil },
		Verify: func(context.Context, *proxy.State, proxy.Backend) (*statusapi.Verification, error) {
			return &statusapi.Verification{ServicePorts: 1}, nil
		},
	})
	ctx := context.Background()
	_ = s.Sync(ctx, &proxy.State{})
	for _, tc := range []struct {
		to      string
		cidrs   string
		primary bool
	}{
		{"nftables", "[]", true},
		{"iptables-nft", "[10.0.0.0/8]", false},
		{"none", "[]", true},
	} {
		target, _ := proxy.ParseTarget(tc.to)
		if _, err := s.Request(target, "test"); err != nil {
			t.Fatal(err)
		}
		_ = s.Sync(ctx, &proxy.State{})
		cidrs, primary := s.NodePortScope()
		if fmt.Sprint(cidrs) != tc.cidrs || primary != tc.primary {
			t.Errorf("running %s: %v, %v; want %s, %v", tc.to, cidrs, primary, tc.cidrs, tc.primary)
		}
	}
}
