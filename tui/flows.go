package tui

import (
	"math"

	"github.com/kpproxy/kp/conntrack"
)

// Columns of the flows view.
const (
	flowService = iota
	flowClient
	flowVirtual
	flowEndpoint
	flowEPState
	flowProto
	flowState
	flowAge
	flowPackets
	flowBytes
)

// flowsPage is the live conntrack table, attributed to Service ports.
type flowsPage struct{ tablePage }

func flowColumns() []column {
	return []column{
		flowService:  {title: "SERVICE", min: 12},
		flowClient:   {title: "CLIENT", min: 17},
		flowVirtual:  {title: "VIRTUAL", min: 17, drop: 3},
		flowEndpoint: {title: "ENDPOINT", min: 17},
		// the endpoint's state: gone marks a flow pinned to a gone one
		flowEPState: {title: "EP", width: 7, drop: 2},
		flowProto:   {title: "PROTO", width: 5, drop: 4},
		flowState:   {title: "STATE", width: 11},
		flowAge:     {title: "AGE", width: 5, right: true},
		flowPackets: {title: "PKTS", width: 5, right: true, drop: 3},
		flowBytes:   {title: "BYTES", width: 6, right: true, drop: 1},
	}
}

func flowSorts() []sortKey {
	return []sortKey{
		sortBinding("N", "service", flowService),
		sortBinding("C", "client", flowClient),
		sortBinding("E", "endpoint", flowEndpoint),
		sortBinding("W", "endpoint's state (gone first)", flowEPState),
		sortBinding("S", "state", flowState),
		sortBinding("A", "age", flowAge),
		sortBinding("P", "packets", flowPackets),
		sortBinding("B", "bytes", flowBytes),
	}
}

func newFlowsPage(c *Common, s *store) *flowsPage {
	p := &flowsPage{tablePage{c: c, s: s, sorts: flowSorts(),
		detailOf:  func(r *row) spKey { return r.id.(flowRowID).sp },
		explainOf: func(r *row) explainRequest { return flowPacket(r.id.(flowRowID)) }}}
	p.t.cols = flowColumns()
	return p
}

func (p *flowsPage) name() string { return "flows" }

// flowRowID identifies a flow row: its Service port and client.
type flowRowID struct {
	sp     spKey
	client string
	proto  string
	dst    string
}

func (p *flowsPage) refresh() {
	var rows []row
	for _, r := range p.s.reports(nil) {
		fr := flowRow(r)
		if p.keep(fr.cells) {
			rows = append(rows, fr)
		}
	}
	p.t.setRows(rows)
}

// flowRow is a flow's line; one pinned to a gone endpoint, or a UDP
// entry never answered, is highlighted (problems.go).
func flowRow(r conntrack.FlowReport) row {
	age, nage := ageOf(r.AgeSeconds)
	pkts, npkts := countOrUnknown(r.Packets)
	bytes, nbytes := countOrUnknown(r.Bytes)
	k := reportKey(r)
	nan := math.NaN()
	gone, unreplied := troubled(r)
	return row{
		alert: gone || unreplied,
		id:    flowRowID{k, r.Client, r.Protocol, r.Frontend},
		cells: []string{
			flowService:  k.String(),
			flowClient:   r.Client,
			flowVirtual:  r.Frontend,
			flowEndpoint: r.Endpoint,
			flowEPState:  r.EndpointState,
			flowProto:    r.Protocol,
			flowState:    r.State,
			flowAge:      age,
			flowPackets:  pkts,
			flowBytes:    bytes,
		},
		nums: []float64{nan, nan, nan, nan, epRank(r.EndpointState), nan, nan, nage, npkts, nbytes},
	}
}

func (p *flowsPage) View() string {
	waiting := ""
	if p.s.flowsAt.IsZero() {
		waiting = "waiting for the conntrack table…"
	}
	return p.view(waiting, "(no flow matches the filter)", "(no flows to Services)")
}

// epRank sorts flows by their endpoint's state, the troubled first.
func epRank(state string) float64 {
	switch state {
	case endpointGone:
		return 0
	case "none":
		return 1
	case "not-ready":
		return 2
	case "serving":
		return 3
	}
	return 4
}
