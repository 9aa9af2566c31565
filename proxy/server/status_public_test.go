package server

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kpproxy/kp/migrate"
	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

func TestHealthzPortServesReadOnlyStatusAndInventory(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	health := NewHealth(time.Minute, clk)
	status := NewStatus(proxy.NoneBackend{}, "node-a", health, clk)
	var runs atomic.Int32
	h := withPublicStatus(health.Handler(), status, func(context.Context) ([]statusapi.Program, error) {
		runs.Add(1)
		return []statusapi.Program{{Owner: "kube-proxy", Mode: "iptables/ipvs", Where: "iptables-nft IPv4", Chains: 3, Rules: 9}}, nil
	}, "node-a")

	get := func(method, path string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
		return rec
	}
	var st statusapi.Status
	if rec := get(http.MethodGet, statusapi.StatusPath); rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &st) != nil || st.Node != "node-a" || st.Mode != "none" {
		t.Errorf("GET %s: %d %s", statusapi.StatusPath, rec.Code, rec.Body)
	}
	var inv statusapi.Inventory
	for i := 0; i < 3; i++ {
		if rec := get(http.MethodGet, statusapi.InventoryPath); rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &inv) != nil || len(inv.Programs) != 1 {
			t.Errorf("GET %s: %d %s", statusapi.InventoryPath, rec.Code, rec.Body)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("3 requests within a second ran the inventory %d times, want 1", n)
	}
	if rec := get(http.MethodPost, statusapi.MigrationPath); rec.Code == http.StatusAccepted {
		t.Errorf("POST %s accepted on the healthz port", statusapi.MigrationPath)
	}
	if rec := get(http.MethodGet, statusapi.ServicesPath); rec.Code != http.StatusNotFound {
		t.Errorf("GET %s on the healthz port: %d, want 404 (the endpoints stay on the metrics address)", statusapi.ServicesPath, rec.Code)
	}
	if rec := get(http.MethodGet, "/livez"); rec.Code != http.StatusServiceUnavailable {
		t.Errorf("/livez before any sync: %d, want 503 (the health handler still serves the rest)", rec.Code)
	}
}

func TestMigrationRequestRefusesTheNoneMode(t *testing.T) {
	sw := migrate.NewSwitcher(migrate.SwitcherConfig{Initial: proxy.NoneBackend{}, InitialTarget: proxy.Target{Mode: proxy.ModeNFTables}})
	rec := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, statusapi.MigrationPath, strings.NewReader(`{"to":"none"}`))
	r.RemoteAddr = "127.0.0.1:40000"
	serveMigrationRequest(rec, r, sw)
	if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "annotation") {
		t.Errorf("POST to none: %d %s, want 400 naming the annotation", rec.Code, rec.Body)
	}
	if sw.Migration() != nil {
		t.Errorf("a switch was recorded: %+v", sw.Migration())
	}
}
