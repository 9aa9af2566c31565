package tui

import (
	"github.com/kpproxy/kp/conntrack"
)

// Flows that show a Service in trouble, as conntrack tells them:
//   - pinned to a gone endpoint: DNATed to an address that is no longer
//     an endpoint of the Service port (conntrack's EndpointState "gone",
//     the entries kp's cleaner deletes for UDP after the next sync; TCP
//     ones stay until the connection ends);
//   - a UDP entry that never got a reply (UNREPLIED): an endpoint that
//     answers nothing, the symptom of a blackhole. A query waiting for
//     its answer is one for the moment it waits; a blackhole stays.

// flowProblems counts a Service port's troubled flows.
type flowProblems struct {
	gone, unreplied int
}

// proxied says kp proxies in user space: the kernel redirects a Service's
// flows to kp's own listeners, so their reply source is the node, never
// an endpoint, and no flow is pinned anywhere.
func (s *store) proxied() bool { return s.status != nil && s.status.Mode == "userspace" }

// troubled reports what is wrong with a flow of a Service port.
func troubled(r conntrack.FlowReport) (gone, unreplied bool) {
	return r.EndpointState == endpointGone, r.Protocol == "UDP" && r.State == "UNREPLIED"
}

// endpointGone is conntrack.FlowReport's EndpointState of a flow DNATed
// to an address that is no endpoint of its Service port any more.
const endpointGone = "gone"

// problems counts the troubled flows of each Service port.
func (s *store) problems() map[spKey]flowProblems {
	out := map[spKey]flowProblems{}
	for _, f := range s.flows {
		a, ok := s.index.Attribute(f)
		if !ok {
			continue
		}
		p := out[a.ServicePort]
		if f.DNATed() && !a.Known && !s.proxied() {
			p.gone++
		}
		if f.Protocol == conntrack.ProtoUDP && f.State() == "UNREPLIED" {
			p.unreplied++
		}
		out[a.ServicePort] = p
	}
	return out
}
