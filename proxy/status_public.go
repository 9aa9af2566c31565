package proxy

import (
	"context"
	"net/http"
	"time"

	"github.com/kpproxy/kp/proxy/statusapi"
)

// InventoryFunc lists what programs the node's Services in the kernel now
// (kp's rules and other proxies'); cmd/kp supplies migrate.Inventory.
type InventoryFunc func(ctx context.Context) ([]statusapi.Program, error)

// withPublicStatus adds to the healthz server (bound on every address, as
// upstream's 10256, so the API server's pod proxy reaches it) the read-only
// status kp migrate cluster gates its steps on: GET /kp/v1/status (mode,
// health, last sync, last switch) and GET /kp/v1/inventory. Nothing that
// changes anything is served there: mode switches stay on the metrics
// address, from loopback. The services list stays there too (it names
// every endpoint).
func withPublicStatus(health http.Handler, status *Status, inventory InventoryFunc, node string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+statusapi.StatusPath, func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, status.Report())
	})
	mux.HandleFunc("GET "+statusapi.InventoryPath, func(w http.ResponseWriter, r *http.Request) {
		inv := statusapi.Inventory{APIVersion: "kp/" + statusapi.Version, Node: node, Time: time.Now(), Programs: []statusapi.Program{}}
		if inventory != nil {
			ctx, cancel := context.WithTimeout(r.Context(), 20*time.Second)
			defer cancel()
			progs, err := inventory(ctx)
			if progs != nil {
				inv.Programs = progs
			}
			if err != nil {
				inv.Error = err.Error()
			}
		}
		writeJSON(w, inv)
	})
	mux.Handle("/", health)
	return mux
}
