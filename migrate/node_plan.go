package migrate

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// Plan is what kp migrate node will do on one node, computed from kp's
// status and the node's rules.
type Plan struct {
	st              *statusapi.Status
	running, target proxy.Target
	found           []Found
	keep, remove    []Found
}

// NewPlan sorts what programs the node (found) into what a switch from
// running to target keeps and what it removes.
func NewPlan(st *statusapi.Status, running, target proxy.Target, found []Found) *Plan {
	p := &Plan{st: st, running: running, target: target, found: found}
	for _, f := range found {
		if f.Is("kp", target) {
			p.keep = append(p.keep, f)
		} else {
			p.remove = append(p.remove, f)
		}
	}
	return p
}

// Nothing reports whether the node is already where the plan leads.
func (p *Plan) Nothing() bool {
	return p.running.Satisfies(p.target) && len(p.remove) == 0
}

// Print writes the plan for a person.
func (p *Plan) Print(w io.Writer) {
	st := p.st
	health := "healthy"
	if !st.Healthy {
		health = "NOT healthy"
	}
	fmt.Fprintf(w, "Node %s: kp runs %s (%d service ports, %d endpoints, %s).\n", st.Node, p.running, st.ServicePorts, st.Endpoints, health)
	if m := st.Migration; m != nil && m.Phase != statusapi.MigrationSucceeded {
		fmt.Fprintf(w, "Last switch: to %s, %s", m.To, m.Phase)
		if m.Error != "" {
			fmt.Fprintf(w, ": %s", m.Error)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "Programming this node's Services now:")
	PrintFound(w, p.found)
	fmt.Fprintf(w, "\nPlan (to %s):\n", p.target)
	if p.running.Satisfies(p.target) {
		fmt.Fprintf(w, "  1. program  nothing: kp already runs %s\n", p.running)
	} else {
		fmt.Fprintf(w, "  1. program  add %s's rules for %d service ports and %d endpoints while %s serves\n",
			p.target, st.ServicePorts, st.Endpoints, p.running)
	}
	fmt.Fprintf(w, "  2. verify   a connection from the node to every ClusterIP, NodePort (on each NodePort address), externalIP\n"+
		"              and LoadBalancer IP with endpoints, each proven by %s's counters\n", p.target)
	if len(p.remove) == 0 {
		fmt.Fprintln(w, "  3. remove   nothing")
		return
	}
	fmt.Fprintln(w, "  3. remove")
	for _, f := range p.remove {
		fmt.Fprintf(w, "       %s %s in %s: %s\n", f.Owner, f.Mode, f.Where, f.Size())
	}
}

// PrintFound lists what programs a node's Services, one line each.
func PrintFound(w io.Writer, found []Found) {
	if len(found) == 0 {
		fmt.Fprintln(w, "  (nothing)")
		return
	}
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	for _, f := range found {
		fmt.Fprintf(tw, "  %s %s\t%s\t%s\n", f.Owner, f.Mode, f.Where, f.Size())
	}
	_ = tw.Flush()
}
