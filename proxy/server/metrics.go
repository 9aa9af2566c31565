package server

import (
	"fmt"
	"net/http"
	"time"

	"github.com/kpproxy/kp/proxy"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics holds kp's Prometheus metrics in a registry of its own. Names
// follow upstream kube-proxy where it has one, so existing dashboards and
// alerts keep working; kp's additions are prefixed kp_.
type Metrics struct {
	registry *prometheus.Registry
	mode     proxy.Mode
	// modeOf, when set, says the mode now (a proxy that switches modes).
	modeOf func() proxy.Mode

	// Upstream (v1.36) labels most sync metrics with ip_family, one
	// proxier per family; kp syncs both families in one transaction, so
	// each observation is recorded for both.
	syncDuration        *prometheus.HistogramVec
	fullSyncDuration    *prometheus.HistogramVec
	partialSyncDuration *prometheus.HistogramVec
	lastSync            *prometheus.GaugeVec
	lastQueued          *prometheus.GaugeVec
	programming         *prometheus.HistogramVec
	failures            prometheus.Counter
	nftFailures         *prometheus.CounterVec
	driftRepairs        *prometheus.CounterVec

	serviceMetrics
}

// ipFamilies are the label values of upstream's ip_family label.
var ipFamilies = []string{proxy.IPv4.String(), proxy.IPv6.String()}

// NewMetrics returns the metrics of a proxy running in mode, registered with
// a new registry together with the Go runtime and process collectors.
func NewMetrics(mode proxy.Mode) *Metrics {
	syncBuckets := prometheus.ExponentialBuckets(0.001, 2, 15)
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		mode:     mode,
		syncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kubeproxy_sync_proxy_rules_duration_seconds",
			Help:    "SyncProxyRules latency in seconds",
			Buckets: syncBuckets,
		}, []string{"ip_family"}),
		fullSyncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kubeproxy_sync_full_proxy_rules_duration_seconds",
			Help:    "SyncProxyRules latency in seconds for full resyncs",
			Buckets: syncBuckets,
		}, []string{"ip_family"}),
		partialSyncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kubeproxy_sync_partial_proxy_rules_duration_seconds",
			Help:    "SyncProxyRules latency in seconds for partial resyncs",
			Buckets: syncBuckets,
		}, []string{"ip_family"}),
		lastSync: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
			Help: "The last time proxy rules were successfully synced",
		}, []string{"ip_family"}),
		lastQueued: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
			Help: "The last time a sync of proxy rules was queued",
		}, []string{"ip_family"}),
		programming: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kubeproxy_network_programming_duration_seconds",
			Help:    "In Cluster Network Programming Latency in seconds",
			Buckets: programmingBuckets(),
		}, []string{"ip_family"}),
		// kp's own, whatever the mode; the nftables mode also counts
		// upstream's kubeproxy_sync_proxy_rules_nftables_sync_failures_total.
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kp_sync_proxy_rules_failures_total",
			Help: "Syncs of proxy rules that failed (each is retried)",
		}),
		nftFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
			Help: "Cumulative proxy nftables sync failures",
		}, []string{"ip_family"}),
		driftRepairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kp_rules_drift_repairs_total",
			Help: "Syncs that repaired changes another process made to kp's rules, by the mode that ran",
		}, []string{"mode"}),
		serviceMetrics: newServiceMetrics(),
	}
	m.registry.MustRegister(
		m.syncDuration, m.fullSyncDuration, m.partialSyncDuration,
		m.lastSync, m.lastQueued, m.programming, m.failures, m.driftRepairs,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	m.serviceMetrics.register(m.registry)
	if mode == proxy.ModeNFTables {
		m.registry.MustRegister(m.nftFailures)
	}
	// Series start at zero, as upstream's do once its proxiers run, so
	// that rate() and alerts see the first failure.
	for _, f := range ipFamilies {
		m.nftFailures.WithLabelValues(f)
		m.syncDuration.WithLabelValues(f)
	}
	m.driftRepairs.WithLabelValues(string(mode))
	return m
}

// programmingBuckets are upstream's: fine-grained under a minute, where the
// SLO lives, coarse up to five minutes.
func programmingBuckets() []float64 {
	b := []float64{0}
	b = append(b, prometheus.LinearBuckets(0.25, 0.25, 2)...) // 0.25s, 0.5s
	b = append(b, prometheus.LinearBuckets(1, 1, 59)...)      // 1s .. 59s
	b = append(b, prometheus.LinearBuckets(60, 5, 12)...)     // 60s .. 115s
	b = append(b, prometheus.LinearBuckets(120, 30, 7)...)    // 2min .. 5min
	return b
}

// Registry lets other parts of kp (a backend's counters) add collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.registry }

// SyncSucceeded records a successful sync that took d and ended at end;
// full says whether the backend re-rendered everything.
func (m *Metrics) SyncSucceeded(d time.Duration, full bool, end time.Time) {
	for _, f := range ipFamilies {
		m.syncDuration.WithLabelValues(f).Observe(d.Seconds())
		if full {
			m.fullSyncDuration.WithLabelValues(f).Observe(d.Seconds())
		} else {
			m.partialSyncDuration.WithLabelValues(f).Observe(d.Seconds())
		}
		m.lastSync.WithLabelValues(f).Set(float64(end.UnixNano()) / 1e9)
	}
}

// SyncFailed counts a failed sync.
func (m *Metrics) SyncFailed() {
	m.failures.Inc()
	for _, f := range ipFamilies {
		m.nftFailures.WithLabelValues(f).Inc()
	}
}

// DriftRepaired counts a sync of mode that repaired changes another
// process made to kp's rules.
func (m *Metrics) DriftRepaired(mode proxy.Mode) { m.driftRepairs.WithLabelValues(string(mode)).Inc() }

// Queued records that a change queued a sync at t.
func (m *Metrics) Queued(t time.Time) {
	for _, f := range ipFamilies {
		m.lastQueued.WithLabelValues(f).Set(float64(t.UnixNano()) / 1e9)
	}
}

// Programmed observes the network programming latency of every change
// whose trigger time is in triggers, now that it is in the kernel.
func (m *Metrics) Programmed(triggers map[proxy.ServicePortName]time.Time, now time.Time) {
	for _, t := range triggers {
		if d := now.Sub(t); d >= 0 {
			for _, f := range ipFamilies {
				m.programming.WithLabelValues(f).Observe(d.Seconds())
			}
		}
	}
}

// FollowMode makes /proxyMode report modeOf's answer, for a proxy that
// switches modes while it runs.
func (m *Metrics) FollowMode(modeOf func() proxy.Mode) { m.modeOf = modeOf }

// Handler serves /metrics (Prometheus text format), /proxyMode (the mode
// name as plain text) and /healthz ("ok"), as upstream's metrics server does.
func (m *Metrics) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		mode := m.mode
		if m.modeOf != nil {
			mode = m.modeOf()
		}
		fmt.Fprint(w, mode)
	})
	// Upstream's metrics server answers a plain liveness ping too (the
	// generic apiserver healthz handler); some monitoring probes it.
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		fmt.Fprint(w, "ok")
	})
	return mux
}
