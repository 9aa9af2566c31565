package cluster

import (
	"encoding/json"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
)

// The label and annotations of the rollout (see the package doc).
const (
	LabelProxy          = "kpproxy.io/proxy"
	AnnotationMigration = "kpproxy.io/migration"
	// annotationProxyMode is proxy.AnnotationProxyMode, spelled here so the
	// package needs nothing of the proxy's.
	annotationProxyMode = "kpproxy.io/proxy-mode"
)

// Values of LabelProxy.
const (
	ProxyKubeProxy = "kube-proxy"
	ProxyKP        = "kp"
	ProxyHandback  = "handback"
)

// ModeNone is kp's mode that programs nothing (proxy.ModeNone).
const ModeNone = "none"

// Kinds of rollout.
const (
	KindFromKubeProxy = "from-kube-proxy"
	KindTo            = "to"
)

// Phases of a node's Record.
const (
	PhaseRunning = "running"
	PhaseDone    = "done"
	PhaseFailed  = "failed"
	// PhaseRollingBack: a rollback has begun on the node.
	PhaseRollingBack = "rolling-back"
)

// Record is what the rollout writes on a Node, as JSON in
// AnnotationMigration.
type Record struct {
	Kind string `json:"kind"`         // from-kube-proxy, to
	To   string `json:"to,omitempty"` // the mode asked for ("" : kp's configured mode)
	// Phase is running, done, failed or rolling-back.
	Phase string `json:"phase"`
	// Step and Error say where a failed node stopped.
	Step  string `json:"step,omitempty"`
	Error string `json:"error,omitempty"`
	// Previous is the mode kp ran before (kind to), for rollback;
	// PreviousAnnotation the kpproxy.io/proxy-mode value before ("" when
	// absent), restored by rollback.
	Previous           string    `json:"previous,omitempty"`
	PreviousAnnotation string    `json:"previousAnnotation,omitempty"`
	Time               time.Time `json:"time"`
}

// recordOf reads n's Record; nil when n has none.
func recordOf(n *v1.Node) (*Record, error) {
	s, ok := n.Annotations[AnnotationMigration]
	if !ok || s == "" {
		return nil, nil
	}
	var r Record
	if err := json.Unmarshal([]byte(s), &r); err != nil {
		return nil, fmt.Errorf("node %s: annotation %s: %w", n.Name, AnnotationMigration, err)
	}
	return &r, nil
}

func (r *Record) String() string {
	b, _ := json.Marshal(r)
	return string(b)
}

// matches says whether r belongs to the rollout req asks for.
func (r *Record) matches(req Request) bool {
	if r == nil || r.Kind != req.kind() {
		return false
	}
	return req.FromKubeProxy || r.To == req.To
}
