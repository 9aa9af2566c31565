package server

import (
	"iter"
	"strconv"
	"sync/atomic"

	"github.com/kpproxy/kp/proxy"
	"github.com/prometheus/client_golang/prometheus"
)

// serviceMetrics are upstream's metrics about the input rather than the
// kernel: change counters, Services with a Local policy and no local
// endpoint, and the health handlers' responses.
type serviceMetrics struct {
	noLocalEndpoints *prometheus.GaugeVec
	// localPolicy keeps the ports with a Local traffic policy, the only
	// ones noLocalEndpoints counts (a sync must not walk every Service).
	localPolicy  *proxy.PortSet
	healthzTotal *prometheus.CounterVec
	livezTotal   *prometheus.CounterVec
	// changes is set once the tracker exists (the metrics are created
	// first, so the servers can start before the sources).
	changes atomic.Pointer[proxy.ChangeTracker]
}

func newServiceMetrics() serviceMetrics {
	return serviceMetrics{
		localPolicy: proxy.NewPortSet(localPolicy),
		noLocalEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
			Help: "Number of services with a Local traffic policy and no endpoints",
		}, []string{"traffic_policy", "ip_family"}),
		healthzTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubeproxy_proxy_healthz_total",
			Help: "Cumulative proxy healthz HTTP status",
		}, []string{"code"}),
		livezTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubeproxy_proxy_livez_total",
			Help: "Cumulative proxy livez HTTP status",
		}, []string{"code"}),
	}
}

func (m *serviceMetrics) register(r *prometheus.Registry) {
	count := func(pick func(proxy.ChangeCounts) uint64) func() float64 {
		return func() float64 {
			t := m.changes.Load()
			if t == nil {
				return 0
			}
			return float64(pick(t.ChangeCounts()))
		}
	}
	r.MustRegister(m.noLocalEndpoints, m.healthzTotal, m.livezTotal,
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "kubeproxy_sync_proxy_rules_endpoint_changes_total",
			Help: "Cumulative proxy rules Endpoint changes",
		}, count(func(c proxy.ChangeCounts) uint64 { return c.EndpointsTotal })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
			Help: "Pending proxy rules Endpoint changes",
		}, count(func(c proxy.ChangeCounts) uint64 { return c.EndpointsPending })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "kubeproxy_sync_proxy_rules_service_changes_total",
			Help: "Cumulative proxy rules Service changes",
		}, count(func(c proxy.ChangeCounts) uint64 { return c.ServicesTotal })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kubeproxy_sync_proxy_rules_service_changes_pending",
			Help: "Pending proxy rules Service changes",
		}, count(func(c proxy.ChangeCounts) uint64 { return c.ServicesPending })),
	)
	for _, f := range ipFamilies {
		for _, p := range []string{"internal", "external"} {
			m.noLocalEndpoints.WithLabelValues(p, f)
		}
	}
}

// ObserveTracker makes the change metrics read t's counters.
func (m *Metrics) ObserveTracker(t *proxy.ChangeTracker) { m.changes.Store(t) }

// ObserveHealth counts h's responses.
func (m *Metrics) ObserveHealth(h *Health) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.observe = func(path string, code int) {
		vec := m.healthzTotal
		if path == "/livez" {
			vec = m.livezTotal
		}
		vec.WithLabelValues(strconv.Itoa(code)).Inc()
	}
}

// ObserveState sets the gauges computed from a synced State.
func (m *Metrics) ObserveState(st *proxy.State) {
	for f, n := range noLocalEndpoints(st, m.localPolicy.Update(st)) {
		m.noLocalEndpoints.WithLabelValues("internal", f.String()).Set(float64(n.internal))
		m.noLocalEndpoints.WithLabelValues("external", f.String()).Set(float64(n.external))
	}
}

type policyCounts struct{ internal, external int }

// localPolicy is true for a port with a Local internal or external
// traffic policy.
func localPolicy(sp *proxy.ServicePort) bool { return sp.InternalPolicyLocal || sp.ExternalPolicyLocal }

// noLocalEndpoints counts, per family, the service ports whose Local traffic
// policy finds no local endpoint although the Service has endpoints, as
// upstream's proxier counts them (a port with no endpoint at all is
// rejected, whatever its policy, and not counted). local names st's ports
// with a Local policy.
func noLocalEndpoints(st *proxy.State, local iter.Seq[proxy.ServicePortName]) map[proxy.Family]policyCounts {
	out := map[proxy.Family]policyCounts{proxy.IPv4: {}, proxy.IPv6: {}}
	for name := range local {
		sp := st.Services[name]
		for _, f := range []proxy.Family{proxy.IPv4, proxy.IPv6} {
			if len(proxy.FilterAddrs(f, sp.ClusterIPs)) == 0 {
				continue
			}
			if sel := proxy.SelectEndpoints(sp, proxy.FilterEndpoints(f, st.Endpoints[name]), st.Node); !sel.Usable || len(sel.Local) > 0 {
				continue
			}
			c := out[f]
			if sp.InternalPolicyLocal {
				c.internal++
			}
			if sp.ExternalPolicyLocal {
				c.external++
			}
			out[f] = c
		}
	}
	return out
}
