package migrate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// Node is the kp running on one node, as a node switch sees it: its status
// API, and what programs the node's Services (listed inside the node's
// network namespace).
type Node interface {
	Status(ctx context.Context) (*statusapi.Status, error)
	RequestMigration(ctx context.Context, req statusapi.MigrationRequest) (*statusapi.Migration, error)
	Migration(ctx context.Context) (*statusapi.Migration, error)
	Inventory(ctx context.Context) ([]Found, error)
}

// NodeSwitch asks the kp running on one node to switch to Target and
// follows the switch to its end (kp migrate node): it prints the plan,
// stops there on DryRun, asks for the switch (or follows one already under
// way to the same target), prints each step as it ends, and fails when
// anything but Target still programs the node's Services afterwards.
type NodeSwitch struct {
	Node   Node
	Target proxy.Target
	DryRun bool
	// Timeout bounds the wait for the switch; Poll is how often its
	// progress is read (0: 200 ms).
	Timeout time.Duration
	Poll    time.Duration
	Out     io.Writer
	// JSON writes to Out as JSON Lines, one NodeEvent each, in place of
	// text.
	JSON bool
	// Name is the node's name until kp's status names it.
	Name string
}

// ErrNoneByNodeSwitch refuses a node switch to the none mode.
var ErrNoneByNodeSwitch = errors.New("--to none: the none mode removes kp's rules and programs nothing; it is kp migrate cluster --rollback's, for handing a node back to kube-proxy")

// NodeError names the node and the step that failed.
func NodeError(node, step string, err error) error {
	if node == "" {
		node = "(unknown)"
	}
	return fmt.Errorf("migrate node %s: step %s: %w", node, step, err)
}

// Run runs the switch.
func (n *NodeSwitch) Run(ctx context.Context) error {
	if n.Target.Mode == proxy.ModeNone {
		return ErrNoneByNodeSwitch
	}
	node := n.Name
	st, err := n.Node.Status(ctx)
	if err != nil {
		return NodeError(node, "plan", err)
	}
	node = st.Node
	found, err := n.Node.Inventory(ctx)
	if err != nil {
		return NodeError(node, "plan", err)
	}
	running := RunningTarget(st)
	p := NewPlan(st, running, n.Target, found)
	if n.JSON {
		n.emit(p.event(n.DryRun))
	} else {
		p.Print(n.Out)
	}
	if p.Nothing() {
		n.say("\nNothing to do: kp runs %s and nothing else programs Services on %s.\n", running, node)
		return nil
	}
	if n.DryRun {
		n.say("\nDry run: nothing changed.\n")
		return nil
	}
	n.say("\nMigrating node %s to %s:\n", node, n.Target)
	id, err := n.request(ctx, st)
	if err != nil {
		return NodeError(node, "request", err)
	}
	final, err := n.follow(ctx, node, id)
	if err != nil {
		return NodeError(node, "wait", err)
	}
	if final.Phase == statusapi.MigrationFailed {
		step := "program"
		for _, s := range final.Steps {
			if s.Error != "" {
				step = s.Name
			}
		}
		return NodeError(node, step, errors.New(final.Error))
	}
	return n.report(ctx, node, final)
}

// request asks for the switch, or returns the id of the one under way to
// the same target (a re-run while it goes on follows it).
func (n *NodeSwitch) request(ctx context.Context, st *statusapi.Status) (uint64, error) {
	if m := st.Migration; m != nil && m.To == n.Target.String() &&
		(m.Phase == statusapi.MigrationPending || m.Phase == statusapi.MigrationRunning) {
		n.emit(NodeEvent{Type: "message", Node: st.Node, Message: fmt.Sprintf("a switch to %s asked by %s is under way; following it", m.To, m.RequestedBy)})
		n.say("  (a switch to %s asked by %s is under way; following it)\n", m.To, m.RequestedBy)
		return m.ID, nil
	}
	mig, err := n.Node.RequestMigration(ctx, statusapi.MigrationRequest{To: n.Target.String(), RequestedBy: "kp migrate node"})
	if err != nil {
		return 0, err
	}
	return mig.ID, nil
}

// report lists what programs the node now and fails on anything stale.
func (n *NodeSwitch) report(ctx context.Context, node string, final *statusapi.Migration) error {
	left, err := n.Node.Inventory(ctx)
	if err != nil {
		return NodeError(node, "report", err)
	}
	if n.JSON {
		n.emit(NodeEvent{Type: "report", Node: node, Target: final.To, Programs: programs(left), KeptForConnections: final.KeptForConnections})
	} else {
		fmt.Fprintf(n.Out, "\nNode %s now runs kp %s. Programming its Services:\n", node, final.To)
		PrintFound(n.Out, left)
	}
	var stale []string
	for _, f := range left {
		// IPVS virtual servers that connections (established, or UDP
		// flows IPVS tracks) still use stay until those end (kp removes
		// them then).
		if !f.Is("kp", n.Target) && !(final.KeptForConnections > 0 && f.Mode == "ipvs") {
			stale = append(stale, f.Owner+" "+f.Mode+" in "+f.Where)
		}
	}
	if k := final.KeptForConnections; k > 0 {
		n.say("\n%d IPVS virtual servers stay while their connections last (IPVS drops a\n"+
			"connection's packets once its virtual server is gone); kp removes them when those connections end.\n", k)
	}
	if len(stale) > 0 {
		return NodeError(node, "remove", fmt.Errorf("still on the node: %s (re-run to retry)", strings.Join(stale, "; ")))
	}
	n.say("\nTo keep %s across kp restarts, annotate the Node: kubectl annotate node %s %s=%s --overwrite\n",
		final.To, node, proxy.AnnotationProxyMode, final.To)
	return nil
}

// follow polls the migration with id until it ends, printing each step as
// it finishes.
func (n *NodeSwitch) follow(ctx context.Context, node string, id uint64) (*statusapi.Migration, error) {
	ctx, cancel := context.WithTimeout(ctx, n.Timeout)
	defer cancel()
	poll := n.Poll
	if poll <= 0 {
		poll = 200 * time.Millisecond
	}
	printed := 0
	for {
		m, err := n.Node.Migration(ctx)
		if err != nil {
			return nil, err
		}
		if m != nil && m.ID == id {
			for ; printed < len(m.Steps) && !m.Steps[printed].Ended.IsZero(); printed++ {
				s := m.Steps[printed]
				if n.JSON {
					n.emit(NodeEvent{Type: "step", Node: node, Step: &s})
					continue
				}
				line := s.Detail
				if s.Error != "" {
					line = "FAILED: " + s.Error
				}
				fmt.Fprintf(n.Out, "  %-8s %s (%s)\n", s.Name, line, s.Ended.Sub(s.Started).Round(time.Millisecond))
			}
			if m.Phase == statusapi.MigrationSucceeded || m.Phase == statusapi.MigrationFailed {
				if v := m.Verification; v != nil {
					for _, w := range v.Warnings {
						n.emit(NodeEvent{Type: "warning", Node: node, Message: w})
						n.say("  warning: %s\n", w)
					}
				}
				return m, nil
			}
		} else if m != nil && m.ID > id {
			return nil, fmt.Errorf("another switch (to %s, asked by %s) replaced this one", m.To, m.RequestedBy)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("kp did not finish the switch within %s", n.Timeout)
		case <-time.After(poll):
		}
	}
}

// RunningTarget is the mode kp reports it runs.
func RunningTarget(st *statusapi.Status) proxy.Target {
	return proxy.Target{Mode: proxy.Mode(st.Mode), IPTablesBackend: st.IPTablesBackend}
}
