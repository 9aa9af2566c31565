package server

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
)

func TestMetricsHandler(t *testing.T) {
	m := NewMetrics(proxy.ModeNFTables)
	now := time.Date(2026, 1, 1, 0, 0, 10, 0, time.UTC)
	m.Queued(now.Add(-time.Second))
	m.SyncSucceeded(20*time.Millisecond, true, now)
	m.SyncSucceeded(5*time.Millisecond, false, now)
	m.SyncFailed()
	m.Programmed(map[proxy.ServicePortName]time.Time{
		statetest.PortName("ns", "web", "http", "TCP"): now.Add(-1500 * time.Millisecond),
		statetest.PortName("ns", "api", "http", "TCP"): now.Add(time.Second), // clock skew: not observed
	}, now)
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()

	metrics := string(get(t, srv.URL+"/metrics", http.StatusOK))
	for _, want := range []string{
		`kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"} 2`,
		`kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv6"} 2`,
		`kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"} 1`,
		`kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="IPv6"} 1`,
		`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.76722561e+09`,
		`kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv6"} 1.767225609e+09`,
		`kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"} 1`,
		`kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="2"} 1`,
		`kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="1"} 0`,
		"kp_sync_proxy_rules_failures_total 1",
		`kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"} 1`,
		`kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv6"} 1`,
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="internal"} 0`,
		"kubeproxy_sync_proxy_rules_endpoint_changes_total 0",
		"kubeproxy_sync_proxy_rules_service_changes_pending 0",
		"go_goroutines",
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	if got := string(get(t, srv.URL+"/proxyMode", http.StatusOK)); got != "nftables" {
		t.Errorf("/proxyMode = %q, want nftables", got)
	}
	if got := string(get(t, srv.URL+"/healthz", http.StatusOK)); got != "ok" {
		t.Errorf("metrics server /healthz = %q, want ok", got)
	}
}

func TestMetricsAreNotShared(t *testing.T) {
	a, b := NewMetrics(proxy.ModeNFTables), NewMetrics(proxy.ModeNFTables)
	a.SyncFailed()
	mfs, err := b.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "kp_sync_proxy_rules_failures_total" && mf.GetMetric()[0].GetCounter().GetValue() != 0 {
			t.Error("a failure counted in one Metrics shows in another")
		}
	}
}
