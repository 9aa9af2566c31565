package tui

import (
	"fmt"
	"math"
	"net/netip"
	"strings"
	"time"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"

	"github.com/kpproxy/kp/proxy/statusapi"
)

// Columns of the detail view's endpoint table.
const (
	epAddr = iota
	epNode
	epZone
	epHints
	epState
	epWhy
	epShare
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
	p := &detailPage{tablePage: tablePage{c: c, s: s, sorts: flowSorts(),
		explainOf: func(r *row) explainRequest { return flowPacket(r.id.(flowRowID)) }}, sp: sp}
	cols := flowColumns()
	cols[flowService].drop = 5 // every row is this Service port's
	p.t.cols = cols
	p.eps.cols = []column{
		epAddr:  {title: "ENDPOINT", min: 15},
		epNode:  {title: "NODE", min: 6, drop: 2},
		epZone:  {title: "ZONE", width: 8, drop: 4},
		epHints: {title: "HINTS", min: 6, drop: 5},
		epState: {title: "STATE", width: 12},
		epWhy:   {title: "WHY", min: 14},
		epShare: {title: "EXPECT/SEEN", width: 11},
		epLast:  {title: "LAST INTERVAL", width: 15, drop: 1},
		epTotal: {title: "SINCE START", width: 15, drop: 3},
	}
	return p
}

func (p *detailPage) name() string { return "service" }

// Update is the flows table's, and x without a flow explains the Service
// port itself.
func (p *detailPage) Update(msg tea.Msg) tea.Cmd {
	if km, ok := msg.(tea.KeyPressMsg); ok && p.t.selected() == nil && key.Matches(km, p.c.Keys.Explain) {
		return showExplain(p.s.servicePacket(p.sp))
	}
	return p.tablePage.Update(msg)
}

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
	why := p.s.why[p.sp]
	for _, e := range sp.Endpoints {
		addr := endpointAddr(e)
		last, total := math.NaN(), math.NaN()
		if n, ok := p.s.epInterval[epKey{p.sp, addr}]; ok && intervalSum > 0 {
			last = float64(n) / float64(intervalSum)
		}
		if e.Counters != nil && totalSum > 0 {
			total = float64(e.Counters.NewConnections) / float64(totalSum)
		}
		w, ok := why.eps[parseAddrPort(addr)]
		if !ok {
			w.expected = math.NaN()
		}
		seen, counted := p.s.seen[epKey{p.sp, addr}]
		eps = append(eps, row{id: addr, alert: seen.diverges, cells: []string{
			epAddr:  addr,
			epNode:  e.NodeName,
			epZone:  e.Zone,
			epHints: hints(e.Hints),
			epState: endpointState(e),
			epWhy:   w.why,
			epShare: expectSeen(w.expected, seen, counted),
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

// expectSeen shows the share an endpoint should get and the share seen
// since its port's selection last changed, marked "!" where the two
// differ beyond chance (diverges).
func expectSeen(expected float64, seen seenShare, counted bool) string {
	actual := math.NaN()
	if counted && seen.n > 0 {
		actual = float64(seen.k) / float64(seen.n)
	}
	s := percent(expected) + "/" + percent(actual)
	if seen.diverges {
		s += " !"
	}
	return s
}

// hints are an endpoint's topology hints: its zones, and "node:" its
// nodes.
func hints(h *statusapi.EndpointHints) string {
	if h == nil {
		return ""
	}
	out := append([]string(nil), h.ForZones...)
	for _, n := range h.ForNodes {
		out = append(out, "node:"+n)
	}
	return strings.Join(out, ",")
}

func parseAddrPort(s string) netip.AddrPort {
	a, _ := netip.ParseAddrPort(s)
	return a
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
	if m := (h - 5) / 2; p.eps.height > m {
		p.eps.height = max(m, 2)
	}
	p.tablePage.SetSize(w, h-5-p.eps.height)
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
	b.WriteString(pad(st.Faint.Render(p.sharesNote()), p.c.Width) + "\n")
	b.WriteString("\n" + p.flowsTitle() + "\n")
	b.WriteString(p.t.View(st, p.c.Width, true))
	return b.String()
}

// sharesNote says what EXPECT/SEEN compares, since when.
func (p *detailPage) sharesNote() string {
	var n uint64
	var since time.Time
	for _, r := range p.eps.rows {
		if ss, ok := p.s.seen[epKey{p.sp, r.id.(string)}]; ok {
			n, since = n+ss.k, ss.since
		}
	}
	if since.IsZero() {
		return "share expected by kp's selection / seen: not counted"
	}
	return fmt.Sprintf("share expected/seen in %d new connections since %s (! beyond %dσ)", n, since.Format(time.TimeOnly),
		divergenceSigmas)
}

// flowsTitle counts the Service port's flows, and those in trouble.
func (p *detailPage) flowsTitle() string {
	st := p.c.Styles
	t := st.Title.Render(fmt.Sprintf("flows (%d)", len(p.t.rows)))
	var gone, unreplied int
	for _, r := range p.t.rows {
		id := r.id.(flowRowID)
		if r.cells[flowEPState] == endpointGone {
			gone++
		}
		if id.proto == "UDP" && r.cells[flowState] == "UNREPLIED" {
			unreplied++
		}
	}
	if gone+unreplied == 0 {
		return t
	}
	return t + "  " + st.Alert.Render(fmt.Sprintf("%d pinned to gone endpoints, %d UDP never answered", gone, unreplied))
}
