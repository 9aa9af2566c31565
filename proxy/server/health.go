package server

import (
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/kpproxy/kp/proxy"
	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"
)

// Health answers the health checks upstream kube-proxy serves on :10256,
// which cloud load balancers probe (externalTrafficPolicy Cluster) and
// kubelets use as liveness probe, with upstream's (v1.36) rules: the proxy is
// unhealthy when a change (a Service, EndpointSlice or Node update) has been
// waiting longer than the timeout (2× the sync period) for a successful
// sync. Periodic resyncs that fail while nothing changed do not make it
// unhealthy, as upstream. kp adds one rule: it is unhealthy until its first
// successful sync, so that nothing probes a node whose rules were never
// written (upstream marks itself updated when its sync loop starts).
type Health struct {
	clk     clock.PassiveClock
	timeout time.Duration

	mu            sync.RWMutex
	lastUpdated   time.Time
	oldestPending time.Time // zero when no change waits for a sync
	nodeEligible  bool
	// observe counts each response by handler and code, for
	// kubeproxy_proxy_healthz_total and kubeproxy_proxy_livez_total.
	observe func(path string, code int)
}

// NewHealth returns a Health that reports unhealthy until the first Updated.
func NewHealth(timeout time.Duration, clk clock.PassiveClock) *Health {
	return &Health{clk: clk, timeout: timeout, nodeEligible: true, observe: func(string, int) {}}
}

// Updated records a successful sync at t: every change queued so far is in
// the kernel.
func (h *Health) Updated(t time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastUpdated = t
	h.oldestPending = time.Time{}
}

// QueuedUpdate records that a change at t waits for a sync.
func (h *Health) QueuedUpdate(t time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.oldestPending.IsZero() {
		h.oldestPending = t
	}
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
			if taint.Key == proxy.ToBeDeletedTaint {
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
	healthy, _, _, _ := h.Status()
	return healthy
}

func (h *Health) Status() (healthy bool, lastUpdated, now time.Time, nodeEligible bool) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	now = h.clk.Now()
	stale := !h.oldestPending.IsZero() && now.Sub(h.oldestPending) >= h.timeout
	healthy = !h.lastUpdated.IsZero() && !stale
	return healthy, h.lastUpdated, now, h.nodeEligible
}

// healthBody is upstream's ProxyHealth JSON. kp programs both families in
// one sync, so both report the same status.
type healthBody struct {
	LastUpdated  time.Time                 `json:"lastUpdated"`
	CurrentTime  time.Time                 `json:"currentTime"`
	NodeEligible *bool                     `json:"nodeEligible,omitempty"`
	Healthy      bool                      `json:"healthy"`
	Status       map[string]familyHealthJS `json:"status,omitempty"`
}

type familyHealthJS struct {
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

// Handler serves /healthz (sync health and node eligibility) and /livez
// (sync health only) with upstream's JSON bodies.
func (h *Health) Handler() http.Handler {
	mux := http.NewServeMux()
	serve := func(path string, withNode bool) {
		mux.HandleFunc(path, func(w http.ResponseWriter, _ *http.Request) {
			healthy, last, now, eligible := h.Status()
			body := healthBody{LastUpdated: last.Round(0), CurrentTime: now.Round(0), Healthy: healthy, Status: map[string]familyHealthJS{}}
			for _, f := range []proxy.Family{proxy.IPv4, proxy.IPv6} {
				body.Status[f.String()] = familyHealthJS{LastUpdated: last.Round(0), Healthy: healthy}
			}
			if withNode {
				body.NodeEligible = &eligible
				healthy = healthy && eligible
			}
			if healthy {
				// Upstream reports "now" while healthy, as older
				// releases did whenever the sync loop ran.
				body.LastUpdated = now.Round(0)
			}
			code := http.StatusOK
			if !healthy {
				code = http.StatusServiceUnavailable
			}
			h.observe(path, code)
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.WriteHeader(code)
			out, _ := json.Marshal(body)
			_, _ = w.Write(out)
		})
	}
	serve("/healthz", true)
	serve("/livez", false)
	return mux
}
