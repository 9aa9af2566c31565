package server

import (
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/proxytest"
	"github.com/kpproxy/kp/proxy/statetest"
)

// The core model's values these tests feed the server (names and
// endpoints from proxy/statetest): the same as the core's own tests build
// from proxytest's objects.

// testPort is the ServicePort proxytest.Service converts to, changed by muts.
func testPort(ns, name string, muts ...func(*proxy.ServicePort)) *proxy.ServicePort {
	sp := &proxy.ServicePort{Name: statetest.PortName(ns, name, "http", v1.ProtocolTCP), Type: v1.ServiceTypeClusterIP,
		ClusterIPs: proxytest.Addrs("10.96.0.10"), Port: 80, Protocol: v1.ProtocolTCP}
	for _, m := range muts {
		m(sp)
	}
	return sp
}

func newTestTracker(t *testing.T, log *slog.Logger) (*proxy.ChangeTracker, *atomic.Int32) {
	t.Helper()
	var notified atomic.Int32
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return proxy.NewChangeTracker(proxy.ChangeTrackerOptions{NodeName: "node-a", Log: log, Sources: 1,
		OnChange: func() { notified.Add(1) },
		Clock:    clocktesting.NewFakePassiveClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))}), &notified
}
