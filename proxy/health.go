package proxy

import (
	"fmt"
	"net/http"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"
)

// toBeDeletedTaint is the Cluster Autoscaler's taint on a node it is about to
// remove; upstream then fails /healthz so load balancers drain the node first.
const toBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// Health answers the health checks upstream kube-proxy serves on :10256,
// which cloud load balancers probe (externalTrafficPolicy Cluster) and
// kubelets use as liveness probe. The proxy is healthy once it has synced and
// while its last successful sync is younger than the timeout (2× the sync
// period: the runner syncs at least once per period, so two missed periods
// mean the sync loop is stuck or failing).
type Health struct {
	clk     clock.PassiveClock
	timeout time.Duration

	mu           sync.RWMutex
	lastUpdated  time.Time
	nodeEligible bool
}

// NewHealth returns a Health that reports unhealthy until the first Updated.
func NewHealth(timeout time.Duration, clk clock.PassiveClock) *Health {
	return &Health{clk: clk, timeout: timeout, nodeEligible: true}
}

// Updated records a successful sync at t.
func (h *Health) Updated(t time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastUpdated = t
}

// SyncNode takes the node's eligibility from the proxy's own Node: a node
// being deleted, or tainted for removal by the autoscaler, fails /healthz
// (not /livez) so that load balancers stop sending it new connections.
func (h *Health) SyncNode(node *v1.Node) {
	eligible := true
	if node != nil {
		if !node.DeletionTimestamp.IsZero() {
			eligible = false
		}
		for _, taint := range node.Spec.Taints {
			if taint.Key == toBeDeletedTaint {
				eligible = false
			}
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nodeEligible = eligible
}

// Healthy reports the sync loop's health, ignoring node eligibility.
func (h *Health) Healthy() bool {
	healthy, _, _, _ := h.status()
	return healthy
}

func (h *Health) status() (healthy bool, lastUpdated, now time.Time, nodeEligible bool) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	now = h.clk.Now()
	healthy = !h.lastUpdated.IsZero() && now.Sub(h.lastUpdated) < h.timeout
	return healthy, h.lastUpdated, now, h.nodeEligible
}

// Handler serves /healthz and /livez with upstream's JSON bodies.
func (h *Health) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		healthy, last, now, eligible := h.status()
		writeHealth(w, healthy && eligible)
		fmt.Fprintf(w, `{"lastUpdated": %q,"currentTime": %q, "nodeEligible": %v}`,
			timeString(last), timeString(now), eligible)
	})
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) {
		healthy, last, now, _ := h.status()
		writeHealth(w, healthy)
		fmt.Fprintf(w, `{"lastUpdated": %q,"currentTime": %q}`, timeString(last), timeString(now))
	})
	return mux
}

func writeHealth(w http.ResponseWriter, healthy bool) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if healthy {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
}

// timeString formats like upstream (Go's time.Time String), minus the
// monotonic clock reading, which means nothing outside the process.
func timeString(t time.Time) string { return t.Round(0).String() }
