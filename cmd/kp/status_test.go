package main

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kpproxy/kp/proxy/statusapi"
)

// serveSocket serves h on a Unix socket in a fresh directory and returns
// its path.
func serveSocket(t *testing.T, h http.Handler) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kps")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "kp.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return path
}

func TestStatusReadsTheSocket(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+statusapi.StatusPath, func(w http.ResponseWriter, _ *http.Request) {
		json.NewEncoder(w).Encode(statusapi.Status{APIVersion: "kp/v1", Mode: "nftables", Node: "node-a", Healthy: true,
			Build: &statusapi.Build{Version: "v1.2.3", Commit: "abc123", BuildDate: "2026-11-20T10:00:00Z", GoVersion: "go1.26.0", Platform: "linux/arm64"}})
	})
	mux.HandleFunc("GET "+statusapi.InventoryPath, func(w http.ResponseWriter, _ *http.Request) {
		json.NewEncoder(w).Encode(statusapi.Inventory{Node: "node-a", Programs: []statusapi.Program{{Owner: "kp", Mode: "nftables", Where: "nftables ip kp"}}})
	})
	path := serveSocket(t, mux)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "--status-socket", path}, "mode:     nftables"},
		{[]string{"status", "--status-socket", path}, "version:  v1.2.3 (commit abc123, built 2026-11-20T10:00:00Z, go1.26.0 linux/arm64)"},
		{[]string{"status", "--status-socket", path, "-o", "json"}, `"mode": "nftables"`},
		{[]string{"status", "--status-socket", path, "--inventory", "-o", "json"}, `"where": "nftables ip kp"`},
	} {
		h := newHarness(t)
		if code := h.run(tc.args...); code != 0 || !strings.Contains(h.stdout.String(), tc.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q, want %q", tc.args, code, h.stdout.String(), h.stderr.String(), tc.want)
		}
	}
	h := newHarness(t)
	if code := h.run("status", "--status-socket", filepath.Join(filepath.Dir(path), "none.sock")); code != 1 ||
		!strings.Contains(h.stderr.String(), "is kp proxy running") {
		t.Errorf("no kp: exit %d, stderr %q", code, h.stderr.String())
	}
}
