package server

import (
	"log/slog"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/proxytest"
)

// The core model's values these tests feed the server: the same as the
// core's own tests build from proxytest's objects.

func spName(ns, name, port string, proto v1.Protocol) proxy.ServicePortName {
	return proxy.ServicePortName{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}, Port: port, Protocol: proto}
}

// ep is a ready, serving endpoint.
func ep(ipPort string, muts ...func(*proxy.Endpoint)) proxy.Endpoint {
	ap := netip.MustParseAddrPort(ipPort)
	e := proxy.Endpoint{IP: ap.Addr(), Port: int32(ap.Port()), Ready: true, Serving: true}
	for _, m := range muts {
		m(&e)
	}
	return e
}

// testPort is the ServicePort proxytest.Service converts to, changed by muts.
func testPort(ns, name string, muts ...func(*proxy.ServicePort)) *proxy.ServicePort {
	sp := &proxy.ServicePort{Name: spName(ns, name, "http", v1.ProtocolTCP), Type: v1.ServiceTypeClusterIP,
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
