package cluster

import (
	"encoding/json"
	"fmt"
	"strconv"
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

// RecordOf reads n's Record; nil when n has none. Whoever may patch the
// Node may write the annotation, so a value that is not a Record this
// package writes (not JSON, or a kind or phase it does not know) is an
// error naming the node and the annotation, and a rollout plans nothing
// from it.
func RecordOf(n *v1.Node) (*Record, error) {
	s, ok := n.Annotations[AnnotationMigration]
	if !ok || s == "" {
		return nil, nil
	}
	var r Record
	err := json.Unmarshal([]byte(s), &r)
	switch {
	case err != nil:
	case r.Kind != KindFromKubeProxy && r.Kind != KindTo:
		err = fmt.Errorf("kind %s: want %s or %s", quote(r.Kind), KindFromKubeProxy, KindTo)
	case r.Phase != PhaseRunning && r.Phase != PhaseDone && r.Phase != PhaseFailed && r.Phase != PhaseRollingBack:
		err = fmt.Errorf("phase %s: want %s, %s, %s or %s", quote(r.Phase), PhaseRunning, PhaseDone, PhaseFailed, PhaseRollingBack)
	}
	if err != nil {
		return nil, fmt.Errorf("node %s: annotation %s: %w (not a record kp migrate cluster writes: fix it, or remove "+
			"it with kubectl annotate node %s %s-, and run again)", n.Name, AnnotationMigration, err, n.Name, AnnotationMigration)
	}
	return &r, nil
}

// quote quotes a value read from a Node for a message, cut to 64 bytes.
func quote(s string) string {
	if len(s) > 64 {
		return strconv.Quote(s[:64]) + "…"
	}
	return strconv.Quote(s)
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
