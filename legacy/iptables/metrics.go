package iptables

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kpproxy/kp/proxy"
)

// metrics are upstream's iptables-mode metrics, with its names and labels.
type metrics struct {
	restoreFailures        *prometheus.CounterVec
	partialRestoreFailures *prometheus.CounterVec
	rulesTotal             *prometheus.GaugeVec
	rulesLast              *prometheus.GaugeVec
}

func newMetrics() *metrics {
	m := &metrics{
		restoreFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
			Help: "Cumulative proxy iptables restore failures",
		}, []string{"ip_family"}),
		partialRestoreFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
			Help: "Cumulative proxy iptables partial restore failures",
		}, []string{"ip_family"}),
		rulesTotal: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kubeproxy_sync_proxy_rules_iptables_total",
			Help: "Total number of iptables rules owned by kube-proxy",
		}, []string{"ip_family", "table"}),
		rulesLast: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kubeproxy_sync_proxy_rules_iptables_last",
			Help: "Number of iptables rules written by kube-proxy in last sync",
		}, []string{"ip_family", "table"}),
	}
	// Series start at zero, as upstream's, so rate() sees the first failure.
	for _, f := range []proxy.Family{proxy.IPv4, proxy.IPv6} {
		m.restoreFailures.WithLabelValues(f.String())
		m.partialRestoreFailures.WithLabelValues(f.String())
	}
	return m
}

// Collectors are the iptables mode's metrics, for the metrics server.
func (b *Backend) Collectors() []prometheus.Collector {
	m := b.metrics
	return []prometheus.Collector{m.restoreFailures, m.partialRestoreFailures, m.rulesTotal, m.rulesLast}
}

// synced records a family's applied sync: rules per table kp owns, and
// how many it sent.
func (m *metrics) synced(f proxy.Family, want []*Chain, in *input) {
	total := map[Table]int{}
	for _, c := range want {
		total[c.Table] += c.ruleCount()
	}
	for _, t := range []Table{TableFilter, TableNAT} {
		m.rulesTotal.WithLabelValues(f.String(), string(t)).Set(float64(total[t]))
		m.rulesLast.WithLabelValues(f.String(), string(t)).Set(float64(in.rules[t]))
	}
}

func (m *metrics) failed(f proxy.Family, full bool) {
	m.restoreFailures.WithLabelValues(f.String()).Inc()
	if !full {
		m.partialRestoreFailures.WithLabelValues(f.String()).Inc()
	}
}
