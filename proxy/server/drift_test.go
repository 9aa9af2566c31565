package server

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/proxytest"
	"github.com/kpproxy/kp/test/logbuf"
)

// driftingBackend is a fakeBackend whose drift detector the test drives:
// each Drift sent on drifts is reported.
type driftingBackend struct {
	*fakeBackend
	drifts chan proxy.Drift
}

func (b *driftingBackend) DetectDrift(ctx context.Context, drifted func(proxy.Drift)) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case d := <-b.drifts:
			drifted(d)
		}
	}
}

// TestRunRepairsDriftAtOnceAndCountsIt: a drift the backend reports runs a
// sync at once, with the periodic resync as good as off (a year); the
// repair is logged with what changed and who changed it, and counted in
// kp_rules_drift_repairs_total; a sync the detector was unsure about is
// not counted, and a failed repair is counted when its retry succeeds.
func TestRunRepairsDriftAtOnceAndCountsIt(t *testing.T) {
	backend := &driftingBackend{fakeBackend: newFakeBackend(0), drifts: make(chan proxy.Drift)}
	cfg := testConfig()
	cfg.SyncPeriod = 365 * 24 * time.Hour
	cfg.MetricsBindAddress = freeAddr(t)
	var logs logbuf.Buffer
	clk, _ := startRunWith(t, cfg, RunOptions{Backend: backend, Log: slog.New(slog.NewTextHandler(&logs, nil)),
		Sources: []proxy.Source{&fakeSource{initial: func(s proxy.Sink) { proxytest.AddService(s, proxytest.Service("ns", "web")) }}}})
	backend.expectSync(t)
	repairs := func() string {
		m := string(get(t, "http://"+cfg.MetricsBindAddress+"/metrics", http.StatusOK))
		for _, line := range strings.Split(m, "\n") {
			if strings.HasPrefix(line, "kp_rules_drift_repairs_total{") {
				return line
			}
		}
		return "no kp_rules_drift_repairs_total in /metrics"
	}
	if got, want := repairs(), `kp_rules_drift_repairs_total{mode="nftables"} 0`; got != want {
		t.Errorf("before any drift: %q, want %q", got, want)
	}

	backend.drifts <- proxy.Drift{What: "ip kp: deleted 1 element of map service-ips", By: "nft (pid 4242)"}
	backend.stepUntilSync(t, clk, time.Second)
	waitFor(t, func() bool { return strings.HasSuffix(repairs(), " 1") })
	for _, want := range []string{"deleted 1 element of map service-ips", "nft (pid 4242)", "repaired kp's rules"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log lacks %q:\n%s", want, logs.String())
		}
	}

	backend.drifts <- proxy.Drift{What: "the kernel's notifications overflowed", Unsure: true}
	backend.stepUntilSync(t, clk, time.Second)
	backend.expectNoSync(t)
	if got := repairs(); !strings.HasSuffix(got, " 1") {
		t.Errorf("after an unsure report: %q, want still 1", got)
	}

	backend.mu.Lock()
	backend.failures = 1
	backend.mu.Unlock()
	backend.drifts <- proxy.Drift{What: "ip kp: flushed chain svc-web"}
	backend.stepUntilSync(t, clk, time.Second) // fails
	backend.stepUntilSync(t, clk, time.Second) // the retry
	waitFor(t, func() bool { return strings.HasSuffix(repairs(), " 2") })
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
