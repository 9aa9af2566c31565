package server

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/kpproxy/kp/proxy"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestHealthHandlers(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const timeout = 60 * time.Second // 2× a 30s sync period
	tests := []struct {
		name         string
		setup        func(h *Health, clk *clocktesting.FakeClock)
		wantHealthz  int
		wantLivez    int
		wantEligible bool
	}{
		{
			name:         "unhealthy before the first sync",
			setup:        func(*Health, *clocktesting.FakeClock) {},
			wantHealthz:  http.StatusServiceUnavailable,
			wantLivez:    http.StatusServiceUnavailable,
			wantEligible: true,
		},
		{
			name: "healthy right after a sync",
			setup: func(h *Health, clk *clocktesting.FakeClock) {
				h.Updated(clk.Now())
				clk.Step(timeout - time.Second)
			},
			wantHealthz:  http.StatusOK,
			wantLivez:    http.StatusOK,
			wantEligible: true,
		},
		{
			name: "healthy long after a sync when nothing changed (failing resyncs do not count)",
			setup: func(h *Health, clk *clocktesting.FakeClock) {
				h.Updated(clk.Now())
				clk.Step(10 * timeout)
			},
			wantHealthz:  http.StatusOK,
			wantLivez:    http.StatusOK,
			wantEligible: true,
		},
		{
			name: "healthy while a queued change is younger than the timeout",
			setup: func(h *Health, clk *clocktesting.FakeClock) {
				h.Updated(clk.Now())
				clk.Step(time.Hour)
				h.QueuedUpdate(clk.Now())
				clk.Step(timeout - time.Second)
				h.QueuedUpdate(clk.Now()) // the oldest pending change counts
			},
			wantHealthz:  http.StatusOK,
			wantLivez:    http.StatusOK,
			wantEligible: true,
		},
		{
			name: "unhealthy when a queued change waits past the timeout",
			setup: func(h *Health, clk *clocktesting.FakeClock) {
				h.Updated(clk.Now())
				h.QueuedUpdate(clk.Now())
				clk.Step(timeout)
			},
			wantHealthz:  http.StatusServiceUnavailable,
			wantLivez:    http.StatusServiceUnavailable,
			wantEligible: true,
		},
		{
			name: "a sync clears the pending change",
			setup: func(h *Health, clk *clocktesting.FakeClock) {
				h.QueuedUpdate(clk.Now())
				clk.Step(timeout)
				h.Updated(clk.Now())
				clk.Step(timeout)
			},
			wantHealthz:  http.StatusOK,
			wantLivez:    http.StatusOK,
			wantEligible: true,
		},
		{
			name: "node tainted for deletion fails healthz but not livez",
			setup: func(h *Health, clk *clocktesting.FakeClock) {
				h.Updated(clk.Now())
				h.SyncNode(&v1.Node{Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: proxy.ToBeDeletedTaint}}}})
			},
			wantHealthz:  http.StatusServiceUnavailable,
			wantLivez:    http.StatusOK,
			wantEligible: false,
		},
		{
			name: "node being deleted fails healthz",
			setup: func(h *Health, clk *clocktesting.FakeClock) {
				h.Updated(clk.Now())
				h.SyncNode(&v1.Node{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &metav1.Time{Time: start}}})
			},
			wantHealthz:  http.StatusServiceUnavailable,
			wantLivez:    http.StatusOK,
			wantEligible: false,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(start)
			h := NewHealth(timeout, clk)
			tt.setup(h, clk)
			srv := httptest.NewServer(h.Handler())
			defer srv.Close()

			body := get(t, srv.URL+"/healthz", tt.wantHealthz)
			var hz struct {
				LastUpdated  time.Time `json:"lastUpdated"`
				CurrentTime  time.Time `json:"currentTime"`
				NodeEligible *bool     `json:"nodeEligible"`
				Healthy      bool      `json:"healthy"`
				Status       map[string]struct {
					Healthy bool `json:"healthy"`
				} `json:"status"`
			}
			if err := json.Unmarshal(body, &hz); err != nil {
				t.Fatalf("healthz body %q: %v", body, err)
			}
			if hz.NodeEligible == nil || *hz.NodeEligible != tt.wantEligible || !hz.CurrentTime.Equal(clk.Now()) ||
				hz.Healthy != (tt.wantLivez == http.StatusOK) || hz.Status["IPv4"].Healthy != hz.Healthy || len(hz.Status) != 2 {
				t.Errorf("healthz body %s", body)
			}
			if tt.wantHealthz == http.StatusOK && !hz.LastUpdated.Equal(clk.Now()) {
				t.Errorf("healthy healthz reports lastUpdated %s, want now (%s) as upstream", hz.LastUpdated, clk.Now())
			}
			body = get(t, srv.URL+"/livez", tt.wantLivez)
			var lz map[string]any
			if err := json.Unmarshal(body, &lz); err != nil || lz["lastUpdated"] == nil || lz["currentTime"] == nil || lz["nodeEligible"] != nil {
				t.Errorf("livez body %q: %v", body, err)
			}
		})
	}
}

func get(t *testing.T, url string, wantCode int) []byte {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	if resp.StatusCode != wantCode {
		t.Errorf("GET %s: %d %s, want %d", url, resp.StatusCode, body, wantCode)
	}
	return body
}
