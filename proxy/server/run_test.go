package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/proxytest"
	"github.com/kpproxy/kp/proxy/statetest"
	v1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

// fakeSource delivers initial objects, then waits for release before it
// reports OnSynced, then applies updates until ctx is done.
type fakeSource struct {
	initial func(proxy.Sink)
	release chan struct{} // nil: synced at once
	updates chan func(proxy.Sink)
	err     error // returned after the initial view, if set
}

func (f *fakeSource) Run(ctx context.Context, sink proxy.Sink) error {
	if f.initial != nil {
		f.initial(sink)
	}
	if f.err != nil {
		return f.err
	}
	if f.release != nil {
		select {
		case <-f.release:
		case <-ctx.Done():
			return nil
		}
	}
	sink.OnSynced()
	for {
		select {
		case <-ctx.Done():
			return nil
		case u := <-f.updates:
			u(sink)
		}
	}
}

func (f *fakeSource) String() string { return "fake" }

// fakeBackend records every State it is asked to sync and fails while
// failures remain.
type fakeBackend struct {
	states   chan *proxy.State
	mu       sync.Mutex
	failures int
}

func newFakeBackend(failures int) *fakeBackend {
	return &fakeBackend{states: make(chan *proxy.State, 100), failures: failures}
}

func (b *fakeBackend) Mode() proxy.Mode              { return proxy.ModeNFTables }
func (b *fakeBackend) Probe(context.Context) error   { return nil }
func (b *fakeBackend) Cleanup(context.Context) error { return nil }
func (b *fakeBackend) Sync(_ context.Context, s *proxy.State) error {
	b.states <- s
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failures > 0 {
		b.failures--
		return errors.New("netlink: operation not permitted")
	}
	return nil
}

func (b *fakeBackend) expectSync(t *testing.T) *proxy.State {
	t.Helper()
	select {
	case s := <-b.states:
		return s
	case <-time.After(5 * time.Second):
		t.Fatal("no sync")
		return nil
	}
}

// stepUntilSync advances the fake clock by d, again every 20 ms of real
// time, until a sync arrives. Stepping once is racy: the runner may still be
// finishing the previous sync, and then measures its next deadline from
// after the step.
func (b *fakeBackend) stepUntilSync(t *testing.T, clk *clocktesting.FakeClock, d time.Duration) *proxy.State {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		clk.Step(d)
		select {
		case s := <-b.states:
			return s
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			t.Fatal("no sync")
			return nil
		}
	}
}

func (b *fakeBackend) expectNoSync(t *testing.T) {
	t.Helper()
	select {
	case s := <-b.states:
		t.Fatalf("unexpected sync of generation %d", s.Generation)
	case <-time.After(50 * time.Millisecond):
	}
}

// startRun runs the proxy on a fake clock and returns a func that stops it
// and returns Run's error.
func startRun(t *testing.T, cfg proxy.Config, backend proxy.Backend, sources ...proxy.Source) (*clocktesting.FakeClock, func() error) {
	t.Helper()
	return startRunWith(t, cfg, RunOptions{Backend: backend, Sources: sources})
}

// startRunWith is startRun with every option.
func startRunWith(t *testing.T, cfg proxy.Config, opts RunOptions) (*clocktesting.FakeClock, func() error) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	if opts.lowerGC == nil { // tests in parallel must not set GOGC for each other
		opts.lowerGC = func(int) func() { return func() {} }
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, opts, clk) }()
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(10 * time.Second):
				t.Error("Run did not return after cancel")
			}
		})
		return runErr
	}
	t.Cleanup(func() { _ = stop() })
	return clk, stop
}

func testConfig() proxy.Config {
	return proxy.Config{Mode: proxy.ModeNFTables, HostnameOverride: "node-a", MinSyncPeriod: time.Second, SyncPeriod: 30 * time.Second}
}

func TestRunSyncsOnlyAfterEverySourceSyncedThenFollowsChanges(t *testing.T) {
	web := statetest.PortName("ns", "web", "http", "TCP")
	kube := &fakeSource{
		initial: func(s proxy.Sink) { proxytest.AddService(s, proxytest.Service("ns", "web")) },
		updates: make(chan func(proxy.Sink)),
	}
	dir := &fakeSource{
		initial: func(s proxy.Sink) { proxytest.AddSlice(s, proxytest.Slice("ns", "web-a", "web", []string{"10.0.0.1"})) },
		release: make(chan struct{}),
	}
	backend := newFakeBackend(0)
	clk, stop := startRun(t, testConfig(), backend, kube, dir)

	backend.expectNoSync(t)
	close(dir.release)
	s := backend.expectSync(t)
	if s.Generation != 1 || len(s.Endpoints[web]) != 1 || s.Node.Name != "node-a" {
		t.Fatalf("first sync: generation %d, endpoints %v, node %q", s.Generation, s.Endpoints[web], s.Node.Name)
	}

	kube.updates <- func(s proxy.Sink) { s.OnService("ns", "web", nil) }
	// The stepped clock may run a periodic sync before the delete reaches
	// the tracker (under arm64 emulation it did): the delete's is the
	// first sync that changes web.
	for i := 0; i < 20; i++ {
		if s = backend.stepUntilSync(t, clk, time.Second); len(s.Changed) > 0 {
			break
		}
	}
	if _, ok := s.Changed[web]; !ok || len(s.Services) != 0 {
		t.Errorf("sync after delete: changed %v, services %v", s.Changed, s.Services)
	}
	if err := stop(); err != nil {
		t.Errorf("Run after cancel: %v, want nil", err)
	}
}

func TestRunRetriesAFailedSyncWithTheLatestState(t *testing.T) {
	backend := newFakeBackend(1)
	clk, _ := startRun(t, testConfig(), backend, &fakeSource{initial: func(s proxy.Sink) { proxytest.AddService(s, proxytest.Service("ns", "web")) }})
	if s := backend.expectSync(t); s.Generation != 1 {
		t.Fatalf("first sync generation %d", s.Generation)
	}
	backend.expectNoSync(t)
	// The first backoff is a second.
	if s := backend.stepUntilSync(t, clk, time.Second); s.Generation != 2 || len(s.Services) != 1 {
		t.Fatalf("retry: generation %d with %d services", s.Generation, len(s.Services))
	}
}

// TestRunReleasesMemoryAfterFullSyncsOnly: kp lowers GOGC for the initial
// lists and puts it back when its first sync starts; a full sync (the
// first successful one, and the one after a failure) gives its garbage
// back, a partial sync does not. Syncs, releases and GOGC changes are
// logged in the order they happen.
func TestRunReleasesMemoryAfterFullSyncsOnly(t *testing.T) {
	var mu sync.Mutex
	var events []string
	event := func(e string) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, e)
	}
	kube := &fakeSource{
		initial: func(s proxy.Sink) { proxytest.AddService(s, proxytest.Service("ns", "web")) },
		updates: make(chan func(proxy.Sink)),
	}
	backend := &loggedBackend{fakeBackend: newFakeBackend(1), event: event}
	clk, _ := startRunWith(t, testConfig(), RunOptions{Backend: backend, Sources: []proxy.Source{kube},
		releaseMemory: func() { event("release") },
		lowerGC: func(percent int) func() {
			event(fmt.Sprintf("GOGC %d", percent))
			return func() { event("GOGC back") }
		}})
	backend.expectSync(t)                      // fails
	backend.stepUntilSync(t, clk, time.Second) // the retry: full
	for _, rv := range []string{"2", "3"} {    // partial
		kube.updates <- func(s proxy.Sink) {
			proxytest.AddService(s, proxytest.Service("ns", "web", func(s *v1.Service) { s.ResourceVersion, s.Spec.Ports[0].Port = rv, 81 }))
		}
		backend.stepUntilSync(t, clk, time.Second)
	}
	// The fourth sync is partial: nothing comes after it.
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"GOGC 50", "GOGC back", "sync 1", "sync 2", "release", "sync 3", "sync 4"}; !slices.Equal(events, want) {
		t.Errorf("events %q, want %q", events, want)
	}
}

// loggedBackend logs the start of every sync.
type loggedBackend struct {
	*fakeBackend
	event func(string)
}

func (b *loggedBackend) Sync(ctx context.Context, s *proxy.State) error {
	b.event(fmt.Sprintf("sync %d", s.Generation))
	return b.fakeBackend.Sync(ctx, s)
}

func TestRunStopsWhenASourceFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	err := run(ctx, testConfig(), RunOptions{Backend: newFakeBackend(0), Sources: []proxy.Source{&fakeSource{err: errors.New("watch forbidden")}}}, clk)
	if err == nil || !strings.Contains(err.Error(), "source fake: watch forbidden") {
		t.Errorf("Run = %v, want the source's error", err)
	}
}

func TestRunRejectsMinSyncPeriodAboveSyncPeriod(t *testing.T) {
	cfg := testConfig()
	cfg.MinSyncPeriod = time.Hour
	err := Run(context.Background(), cfg, RunOptions{Backend: newFakeBackend(0)})
	if err == nil || !strings.Contains(err.Error(), "min sync period") {
		t.Errorf("Run = %v, want a min sync period error", err)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func TestRunServesHealthAndMetrics(t *testing.T) {
	cfg := testConfig()
	cfg.HealthzBindAddress, cfg.MetricsBindAddress = freeAddr(t), freeAddr(t)
	backend := newFakeBackend(0)
	_, stop := startRun(t, cfg, backend, &fakeSource{})
	backend.expectSync(t)

	// Health is updated just after the backend returns: poll briefly.
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get("http://" + cfg.HealthzBindAddress + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz never became healthy (last: %v)", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := string(get(t, "http://"+cfg.MetricsBindAddress+"/proxyMode", http.StatusOK)); got != "nftables" {
		t.Errorf("/proxyMode = %q", got)
	}
	if m := string(get(t, "http://"+cfg.MetricsBindAddress+"/metrics", http.StatusOK)); !strings.Contains(m, `kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"} 1`) {
		t.Errorf("/metrics does not count the first sync as full:\n%s", m)
	}
	get(t, "http://"+cfg.MetricsBindAddress+"/debug/pprof/", http.StatusNotFound) // only with --profiling
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get("http://" + cfg.HealthzBindAddress + "/healthz"); err == nil {
		t.Error("healthz still answers after Run returned")
	}
}

func TestProfilingServesPprofOnTheMetricsServer(t *testing.T) {
	cfg := testConfig()
	cfg.MetricsBindAddress, cfg.Profiling = freeAddr(t), true
	backend := newFakeBackend(0)
	_, stop := startRun(t, cfg, backend, &fakeSource{})
	backend.expectSync(t)
	if got := string(get(t, "http://"+cfg.MetricsBindAddress+"/debug/pprof/", http.StatusOK)); !strings.Contains(got, "goroutine") {
		t.Errorf("/debug/pprof/ does not list the profiles:\n%s", got)
	}
	get(t, "http://"+cfg.MetricsBindAddress+"/proxyMode", http.StatusOK)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

func TestRunFailsWhenABindAddressIsInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := testConfig()
	cfg.HealthzBindAddress = ln.Addr().String()
	err = Run(context.Background(), cfg, RunOptions{Backend: newFakeBackend(0)})
	if err == nil || !strings.Contains(err.Error(), "healthz server") {
		t.Errorf("Run = %v, want a healthz listen error", err)
	}
}

func TestListenDisablesEmptyAddressAndPortZero(t *testing.T) {
	for _, addr := range []string{"", "0.0.0.0:0", "[::]:0"} {
		ln, err := listen("metrics", addr)
		if ln != nil || err != nil {
			t.Errorf("listen(%q) = %v, %v; want disabled", addr, ln, err)
		}
	}
	if _, err := listen("metrics", "10249"); err == nil || !strings.Contains(err.Error(), "metrics bind address") {
		t.Errorf("listen without a host: %v", err)
	}
}

func TestNodeNameIsLowerCasedOverride(t *testing.T) {
	got, err := proxy.NodeName(" Node-A ")
	if err != nil || got != "node-a" {
		t.Errorf("NodeName = %q, %v", got, err)
	}
	if got, err := proxy.NodeName(""); err != nil || got == "" || got != strings.ToLower(got) {
		t.Errorf("NodeName from host name = %q, %v", got, err)
	}
}
