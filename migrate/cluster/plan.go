package cluster

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
)

// Request is one kp migrate cluster command.
type Request struct {
	// FromKubeProxy moves nodes from upstream kube-proxy to kp; To is then
	// the mode kp starts in ("" : its configured mode). Otherwise To is
	// the mode every node's kp switches to.
	FromKubeProxy bool
	To            string
	// MaxUnavailable nodes are in flight at once (at least 1).
	MaxUnavailable int
	// Pause stops at the first failed node: nodes not started yet are left
	// untouched, and a re-run resumes with the failed one.
	Pause bool
	// Rollback reverses the nodes this rollout reached, last first.
	Rollback bool
	// DeleteKubeProxy deletes kube-proxy's DaemonSet once every node runs
	// kp (FromKubeProxy). By default it is kept, running on no node: the
	// way back (Rollback) needs it.
	DeleteKubeProxy bool
	// NodeTimeout bounds each gate of a node's step.
	NodeTimeout time.Duration
}

func (r Request) kind() string {
	if r.FromKubeProxy {
		return KindFromKubeProxy
	}
	return KindTo
}

// Validate checks the request's fields.
func (r Request) Validate() error {
	if !r.FromKubeProxy && r.To == "" {
		return errors.New("--to MODE or --from-kube-proxy is required")
	}
	if r.To == ModeNone {
		return errors.New("--to none: the none mode is the rollback's, for handing a node back to kube-proxy")
	}
	if r.MaxUnavailable < 1 {
		return fmt.Errorf("--max-unavailable %d: at least 1", r.MaxUnavailable)
	}
	return nil
}

// Actions of a plan's node.
const (
	ActionMigrate  = "migrate"
	ActionRollback = "roll back"
	ActionSkip     = "skip"
)

// NodePlan is what the rollout does with one node, and why.
type NodePlan struct {
	Node   string
	Action string
	Reason string
}

// Plan is the rollout's order: the nodes to act on first to last, and the
// ones skipped.
type Plan struct {
	Request Request
	Nodes   []NodePlan
}

// Todo lists the nodes to act on, in order.
func (p *Plan) Todo() []NodePlan {
	var out []NodePlan
	for _, n := range p.Nodes {
		if n.Action != ActionSkip {
			out = append(out, n)
		}
	}
	return out
}

// NewPlan orders nodes for req from what their labels and records say.
// Migrating: a node this rollout left running or failed comes first (it is
// in flight: resume there), then the untouched nodes by name; done nodes are
// skipped. Rolling back: every node this rollout reached, done or not, last
// name first; nodes it never reached are skipped.
func NewPlan(req Request, nodes []v1.Node) (*Plan, error) {
	p := &Plan{Request: req}
	var resume, fresh, back, skip []NodePlan
	sorted := append([]v1.Node(nil), nodes...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	for i := range sorted {
		n := &sorted[i]
		rec, err := RecordOf(n)
		if err != nil {
			return nil, err
		}
		mine := rec.matches(req)
		if rec != nil && !mine && rec.Phase != PhaseDone {
			return nil, fmt.Errorf("node %s: another rollout (%s) is %s there; finish or roll it back first", n.Name, rec, rec.Phase)
		}
		// The label says kp was given the node, whatever record a later
		// rollout (--to) left there.
		label := n.Labels[LabelProxy]
		givenToKP := req.FromKubeProxy && (label == ProxyKP || label == ProxyHandback)
		switch {
		case req.Rollback && mine:
			back = append(back, NodePlan{Node: n.Name, Action: ActionRollback, Reason: "this rollout reached it (" + rec.Phase + ")"})
		case req.Rollback && givenToKP:
			back = append(back, NodePlan{Node: n.Name, Action: ActionRollback, Reason: "labeled " + LabelProxy + "=" + label})
		case req.Rollback:
			skip = append(skip, NodePlan{Node: n.Name, Action: ActionSkip, Reason: "not reached by this rollout"})
		case mine && rec.Phase == PhaseDone && (!req.FromKubeProxy || n.Labels[LabelProxy] == ProxyKP):
			skip = append(skip, NodePlan{Node: n.Name, Action: ActionSkip, Reason: "done"})
		case mine:
			resume = append(resume, NodePlan{Node: n.Name, Action: ActionMigrate, Reason: "resume: " + describe(rec)})
		case !req.FromKubeProxy && label == ProxyKubeProxy:
			skip = append(skip, NodePlan{Node: n.Name, Action: ActionSkip, Reason: "kube-proxy runs there (label " + LabelProxy + "=kube-proxy): no kp to switch"})
		case req.FromKubeProxy && n.Labels[LabelProxy] == ProxyKP:
			skip = append(skip, NodePlan{Node: n.Name, Action: ActionSkip, Reason: "kp runs there already (label " + LabelProxy + "=kp)"})
		default:
			fresh = append(fresh, NodePlan{Node: n.Name, Action: ActionMigrate, Reason: "not started"})
		}
	}
	for i := len(back) - 1; i >= 0; i-- {
		p.Nodes = append(p.Nodes, back[i])
	}
	p.Nodes = append(append(append(p.Nodes, resume...), fresh...), skip...)
	return p, nil
}

func describe(r *Record) string {
	s := r.Phase
	if r.Step != "" {
		s += " at step " + r.Step
	}
	if r.Error != "" {
		s += ": " + r.Error
	}
	return s
}

// Print writes the plan, one line a node.
func (p *Plan) Print(w io.Writer) {
	what := "to kp"
	if p.Request.To != "" {
		what = "to kp " + p.Request.To
	}
	if p.Request.FromKubeProxy {
		what = "from kube-proxy " + what
	}
	if p.Request.Rollback {
		what = "Rolling back the migration " + what
	} else {
		what = "Migrating " + what
	}
	fmt.Fprintf(w, "%s, %d node(s) at a time:\n", what, p.Request.MaxUnavailable)
	for i, n := range p.Nodes {
		fmt.Fprintf(w, "  %2d. %-24s %-9s %s\n", i+1, n.Node, n.Action, n.Reason)
	}
	if len(p.Todo()) == 0 {
		fmt.Fprintln(w, "  nothing to do")
	}
}

// PlanJSON is a Plan in kp migrate cluster -o json's plan Event.
type PlanJSON struct {
	// Kind is "to" (between kp's modes) or "from-kube-proxy"; To the mode
	// ("" : kp's configured one, from kube-proxy).
	Kind           string         `json:"kind"`
	To             string         `json:"to,omitempty"`
	Rollback       bool           `json:"rollback"`
	MaxUnavailable int            `json:"maxUnavailable"`
	Nodes          []NodePlanJSON `json:"nodes"`
}

// NodePlanJSON is one node of a PlanJSON, in the order the rollout takes
// them: Action is migrate, roll back or skip.
type NodePlanJSON struct {
	Node   string `json:"node"`
	Action string `json:"action"`
	Reason string `json:"reason"`
}

// JSON is p as the plan Event carries it.
func (p *Plan) JSON() *PlanJSON {
	out := &PlanJSON{Kind: p.Request.kind(), To: p.Request.To, Rollback: p.Request.Rollback,
		MaxUnavailable: p.Request.MaxUnavailable, Nodes: []NodePlanJSON{}}
	for _, n := range p.Nodes {
		out.Nodes = append(out.Nodes, NodePlanJSON(n))
	}
	return out
}

// String is the plan as Print writes it.
func (p *Plan) String() string {
	var b strings.Builder
	p.Print(&b)
	return b.String()
}
