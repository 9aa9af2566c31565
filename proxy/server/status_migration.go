package server

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// Migrator is a backend that can switch modes while it runs (Switcher);
// the status API serves its progress and takes its requests.
type Migrator interface {
	Current() (proxy.Backend, proxy.Target)
	Migration() *statusapi.Migration
	Request(t proxy.Target, by string) (*statusapi.Migration, error)
}

// serveMigrationRequest takes POST /kp/v1/migration: a JSON body
// (jsonWrites) of one MigrationRequest whose requestedBy is fit for an
// Event. It is served on the status socket alone, whose permissions (root
// on the node) are the gate: a mode switch is a node administrator's act.
func serveMigrationRequest(w http.ResponseWriter, r *http.Request, m Migrator) {
	// The body is JSON and bounded (jsonWrites): one object, nothing after.
	var req statusapi.MigrationRequest
	dec := json.NewDecoder(r.Body)
	if err := dec.Decode(&req); err != nil {
		bodyError(w, err)
		return
	}
	if err := dec.Decode(&struct{}{}); err != io.EOF {
		if err == nil {
			err = errors.New("data after the JSON object")
		}
		bodyError(w, err)
		return
	}
	if err := statusapi.ValidRequestedBy(req.RequestedBy); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	t, err := proxy.ParseTarget(req.To)
	if err != nil {
		http.Error(w, "to: "+err.Error(), http.StatusBadRequest)
		return
	}
	if t.Mode == proxy.ModeNone {
		// It leaves the node without a proxy unless another one serves
		// it: only the Node annotation asks for it (kp migrate cluster
		// --rollback, once kube-proxy's rules are in place).
		http.Error(w, "to: none is asked for by the Node annotation "+proxy.AnnotationProxyMode+" only (kp migrate cluster --rollback; kp with --allow-mode-none)", http.StatusBadRequest)
		return
	}
	by := req.RequestedBy
	if by == "" {
		by = "status API"
	}
	mig, err := m.Request(t, by)
	if err != nil {
		http.Error(w, err.Error(), http.StatusConflict)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	_ = json.NewEncoder(w).Encode(mig)
}
