package migrate

import (
	"encoding/json"
	"fmt"

	"github.com/kpproxy/kp/proxy/statusapi"
)

// NodeEvent is one line of kp migrate node -o json (JSON Lines). Type says
// which kind, and so which fields are set:
//   - "plan": Running, Target, Healthy, ServicePorts, Endpoints, Programs
//     (what programs the node's Services now), Add (whether the program
//     step adds Target's rules), Remove (what the remove step removes),
//     NothingToDo, DryRun;
//   - "message": Message, such as following a switch already under way;
//   - "step": Step, each of the switch's steps (program, verify, remove) as
//     it ends, its Error set if it failed;
//   - "warning": Message, a warning of the verify step;
//   - "report": Target, Programs after the switch, KeptForConnections.
//
// The names are kept stable for scripts.
type NodeEvent struct {
	Type               string                   `json:"type"`
	Node               string                   `json:"node"`
	Running            string                   `json:"running,omitempty"`
	Target             string                   `json:"target,omitempty"`
	Healthy            *bool                    `json:"healthy,omitempty"`
	ServicePorts       int                      `json:"servicePorts,omitempty"`
	Endpoints          int                      `json:"endpoints,omitempty"`
	Programs           []statusapi.Program      `json:"programs,omitempty"`
	Add                bool                     `json:"add,omitempty"`
	Remove             []statusapi.Program      `json:"remove,omitempty"`
	NothingToDo        bool                     `json:"nothingToDo,omitempty"`
	DryRun             bool                     `json:"dryRun,omitempty"`
	Step               *statusapi.MigrationStep `json:"step,omitempty"`
	Message            string                   `json:"message,omitempty"`
	KeptForConnections int                      `json:"keptForConnections,omitempty"`
}

// event is the plan as a NodeEvent.
func (p *Plan) event(dryRun bool) NodeEvent {
	healthy := p.st.Healthy
	return NodeEvent{Type: "plan", Node: p.st.Node, Running: p.running.String(), Target: p.target.String(),
		Healthy: &healthy, ServicePorts: p.st.ServicePorts, Endpoints: p.st.Endpoints,
		Programs: programs(p.found), Add: !p.running.Satisfies(p.target), Remove: programs(p.remove),
		NothingToDo: p.Nothing(), DryRun: dryRun}
}

// programs is found as the status API's inventory lists it; never nil, so
// that JSON says [] for nothing.
func programs(found []Found) []statusapi.Program {
	out := make([]statusapi.Program, 0, len(found))
	for _, f := range found {
		out = append(out, statusapi.Program{Owner: f.Owner, Mode: f.Mode, Where: f.Where, Chains: f.Chains,
			Rules: f.Rules, Elements: f.Elements, VirtualServers: f.VirtualServers})
	}
	return out
}

// emit writes e as one JSON line, with JSON output.
func (n *NodeSwitch) emit(e NodeEvent) {
	if !n.JSON {
		return
	}
	b, err := json.Marshal(e)
	if err != nil {
		b, _ = json.Marshal(NodeEvent{Type: "message", Node: e.Node, Message: "encoding an event: " + err.Error()})
	}
	_, _ = n.Out.Write(append(b, '\n'))
}

// say writes text, with text output.
func (n *NodeSwitch) say(format string, args ...any) {
	if n.JSON {
		return
	}
	fmt.Fprintf(n.Out, format, args...)
}
