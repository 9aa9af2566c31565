package tui

import (
	"fmt"
	"math"
	"strings"

	"github.com/kpproxy/kp/proxy/statusapi"
)

// Columns of the detail view's endpoint table.
const (
	epAddr = iota
	epNode
	epZone
	epState
	epLast
	epTotal
)

// detailPage is one Service port: its endpoints with their share of new
// connections, and its flows below. The flows table has the cursor.
type detailPage struct {
	tablePage
	sp   spKey
	eps  table
	w, h int
}

func newDetailPage(c *Common, s *store, sp spKey) *detailPage {
	p := &detailPage{tablePage: tablePage{c: c, s: s, sorts: flowSorts()}, sp: sp}
	cols := flowColumns()
	cols[flowService].drop = 5 // every row is this Service port's
	p.t.cols = cols
	p.eps.cols = []column{
		epAddr:  {title: "ENDPOINT", min: 15},
		epNode:  {title: "NODE", min: 6, drop: 2},
		epZone:  {title: "ZONE", width: 8, drop: 3},
		epState: {title: "STATE", width: 12},
		epLast:  {title: "LAST INTERVAL", width: 15},
		epTotal: {title: "SINCE START", width: 15, drop: 1},
	}
	return p
}

func (p *detailPage) name() string { return "service" }

func (p *detailPage) refresh() {
	sp, _ := p.s.servicePort(p.sp)
	var intervalSum, totalSum uint64
	for _, e := range sp.Endpoints {
		intervalSum += p.s.epInterval[epKey{p.sp, endpointAddr(e)}]
		if e.Counters != nil {
			totalSum += e.Counters.NewConnections
		}
	}
	var eps []row
	for _, e := range sp.Endpoints {
		addr := endpointAddr(e)
		last, total := math.NaN(), math.NaN()
		if n, ok := p.s.epInterval[epKey{p.sp, addr}]; ok && intervalSum > 0 {
			last = float64(n) / float64(intervalSum)
		}
		if e.Counters != nil && totalSum > 0 {
			total = float64(e.Counters.NewConnections) / float64(totalSum)
		}
		eps = append(eps, row{id: addr, cells: []string{
			epAddr:  addr,
			epNode:  e.NodeName,
			epZone:  e.Zone,
			epState: endpointState(e),
			epLast:  share(last),
			epTotal: share(total),
		}})
	}
	p.eps.setRows(eps)
	p.SetSize(p.w, p.h)

	var rows []row
	for _, r := range p.s.reports(&p.sp) {
		fr := flowRow(r)
		if p.keep(fr.cells) {
			rows = append(rows, fr)
		}
	}
	p.t.setRows(rows)
}

// share draws a share as a bar and a percentage.
func share(v float64) string {
	return fmt.Sprintf("%s %4s", bar(v, 10), percent(v))
}

// endpointState names an endpoint's condition as EndpointSlices do.
func endpointState(e statusapi.Endpoint) string {
	switch {
	case e.Ready:
		return "ready"
	case e.Serving && e.Terminating:
		return "serving,term"
	case e.Terminating:
		return "terminating"
	}
	return "not-ready"
}

func (p *detailPage) SetSize(w, h int) {
	p.w, p.h = w, h
	// Endpoints take what they need up to half the height, the flows the
	// rest; no endpoints take a line to say so.
	p.eps.height = max(len(p.eps.rows), 1) + 1
	if m := (h - 4) / 2; p.eps.height > m {
		p.eps.height = max(m, 2)
	}
	p.tablePage.SetSize(w, h-4-p.eps.height)
}

func (p *detailPage) View() string {
	st := p.c.Styles
	sp, ok := p.s.servicePort(p.sp)
	if !ok {
		return st.Error.Render(fmt.Sprintf("%s is not among kp proxy's Service ports (any more)", p.sp))
	}
	var b strings.Builder
	head := fmt.Sprintf("%s  %s  %s  port %d", st.Title.Render(p.sp.String()), sp.Protocol, sp.Type, sp.Port)
	if sp.NodePort != 0 {
		head += fmt.Sprintf("  nodePort %d", sp.NodePort)
	}
	b.WriteString(pad(head, p.c.Width) + "\n")
	info := fmt.Sprintf("addresses %s  traffic policy ext %s int %s", strings.Join(addresses(sp), ","),
		sp.ExternalTrafficPolicy, sp.InternalTrafficPolicy)
	if sp.SessionAffinitySeconds > 0 {
		info += fmt.Sprintf("  affinity ClientIP %ds", sp.SessionAffinitySeconds)
	}
	b.WriteString(pad(info, p.c.Width) + "\n")
	b.WriteString(p.eps.View(st, p.c.Width, false) + "\n")
	if len(sp.Endpoints) == 0 {
		b.WriteString(st.Faint.Render("(no endpoints)") + "\n")
	}
	b.WriteString("\n" + st.Title.Render(fmt.Sprintf("flows (%d)", len(p.t.rows))) + "\n")
	b.WriteString(p.t.View(st, p.c.Width, true))
	return b.String()
}
