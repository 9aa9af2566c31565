package userspace

import (
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kpproxy/kp/proxy"
)

// endpointStats counts what the proxy itself sent to one endpoint of one
// service port: kp knows every connection, so no conntrack is read.
type endpointStats struct {
	newConns    atomic.Uint64
	activeConns atomic.Int64
	bytes       atomic.Uint64 // both directions
}

// stats holds every endpoint's counters, and the Prometheus metrics.
type stats struct {
	mu  sync.Mutex
	eps map[proxy.EndpointRef]*endpointStats

	active     *prometheus.GaugeVec
	dialErrors *prometheus.CounterVec
	bytes      *prometheus.CounterVec
	conns      *prometheus.CounterVec
	// refused counts connections reset at the cap; idleClosed those
	// closed at the idle timeout.
	refused    *prometheus.CounterVec
	idleClosed *prometheus.CounterVec
	// direct counts connections (TCP) and sessions (UDP) refused because
	// no redirect of kp's brought them (origdst.go, udp.go).
	direct *prometheus.CounterVec
	// syncFailures counts failed writes of a family's redirect table.
	syncFailures *prometheus.CounterVec
	// handover counts what a drain did with its UDP flows (handover.go).
	handover *prometheus.CounterVec
	// refusedPorts are the service ports the last sync refused a listener
	// for want of file descriptors; listenerBudget the sockets the
	// listeners may hold (fdbudget.go).
	refusedPorts   prometheus.Gauge
	listenerBudget prometheus.Gauge
}

func newStats() *stats {
	s := &stats{
		eps: map[proxy.EndpointRef]*endpointStats{},
		active: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kp_userspace_active_connections",
			Help: "Connections (TCP) and sessions (UDP) the userspace proxy holds open",
		}, []string{"protocol"}),
		dialErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kp_userspace_dial_errors_total",
			Help: "Dials to endpoints that failed (the connection was retried on the next endpoint)",
		}, []string{"protocol"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kp_userspace_bytes_total",
			Help: "Bytes the userspace proxy copied, by direction (to_endpoint, to_client)",
		}, []string{"protocol", "direction"}),
		conns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kp_userspace_connections_total",
			Help: "Connections (TCP) and sessions (UDP) the userspace proxy opened to endpoints",
		}, []string{"protocol"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kp_userspace_refused_connections_total",
			Help: "Connections reset at once (UDP: sessions not opened) because their service port held --userspace-max-connections already, or file descriptors were short (kp keeps a reserve of its own)",
		}, []string{"protocol"}),
		direct: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kp_userspace_direct_connections_refused_total",
			Help: "Connections reset at once (TCP: conntrack says nothing redirected them) and sessions not opened (UDP: after the redirect rules were removed) because they came straight to a listener's port, not through a Service",
		}, []string{"protocol"}),
		idleClosed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kp_userspace_idle_closed_total",
			Help: "Connections (TCP) and sessions (UDP) ended by their idle timeout",
		}, []string{"protocol"}),
		syncFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kp_userspace_sync_failures_total",
			Help: "Syncs whose redirect table write failed",
		}, []string{"ip_family"}),
		handover: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kp_userspace_udp_handovers_total",
			Help: "What a switch away from the userspace mode did with its UDP flows: handed_over (redirect entry deleted once the flow was idle), reinjected (a datagram that reached the listener after its flow was handed over, sent on through the new mode from the client's address), reinject_failed (such a datagram lost)",
		}, []string{"result"}),
		refusedPorts: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kp_userspace_refused_service_ports",
			Help: "Service ports the last sync gave no listener (their traffic is rejected) because the listeners' share of RLIMIT_NOFILE was spent; raise the limit",
		}),
		listenerBudget: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kp_userspace_listener_socket_budget",
			Help: "Sockets the listeners may hold: RLIMIT_NOFILE less a reserve for kp itself and a quarter for proxied connections",
		}),
	}
	// Series start at zero, so rate() sees the first event.
	for _, f := range []proxy.Family{proxy.IPv4, proxy.IPv6} {
		s.syncFailures.WithLabelValues(f.String())
	}
	s.refused.WithLabelValues("TCP")
	for _, r := range []string{"handed_over", "reinjected", "reinject_failed"} {
		s.handover.WithLabelValues(r)
	}
	for _, p := range []string{"TCP", "UDP"} {
		s.idleClosed.WithLabelValues(p)
		s.direct.WithLabelValues(p)
	}
	return s
}

func (s *stats) collectors() []prometheus.Collector {
	return []prometheus.Collector{s.active, s.dialErrors, s.bytes, s.conns, s.refused, s.idleClosed, s.direct, s.syncFailures,
		s.handover, s.refusedPorts, s.listenerBudget}
}

// endpoint returns the counters of ref, creating them on first use.
func (s *stats) endpoint(ref proxy.EndpointRef) *endpointStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.eps[ref]
	if e == nil {
		e = &endpointStats{}
		s.eps[ref] = e
	}
	return e
}

// forget drops the counters of endpoints that are neither in keep nor
// still carrying connections.
func (s *stats) forget(keep map[proxy.EndpointRef]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ref, e := range s.eps {
		if !keep[ref] && e.activeConns.Load() == 0 {
			delete(s.eps, ref)
		}
	}
}

// snapshot returns the counters of the endpoints of st.
func (s *stats) snapshot(st *proxy.State) map[proxy.EndpointRef]proxy.EndpointCounter {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[proxy.EndpointRef]proxy.EndpointCounter{}
	for name, eps := range st.Endpoints {
		for _, e := range eps {
			ref := proxy.EndpointRef{ServicePort: name, Endpoint: e.AddrPort()}
			var active int64
			c := proxy.EndpointCounter{Active: &active}
			if e := s.eps[ref]; e != nil {
				active = e.activeConns.Load()
				c.Packets, c.Bytes = e.newConns.Load(), e.bytes.Load()
			}
			out[ref] = c
		}
	}
	return out
}

// active returns the open connections per endpoint (tests, kp flows).
func (s *stats) activeConns() map[proxy.EndpointRef]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[proxy.EndpointRef]int64{}
	for ref, e := range s.eps {
		if n := e.activeConns.Load(); n > 0 {
			out[ref] = n
		}
	}
	return out
}

// ref names endpoint ep of service port name.
func ref(name proxy.ServicePortName, ep netip.AddrPort) proxy.EndpointRef {
	return proxy.EndpointRef{ServicePort: name, Endpoint: ep}
}
