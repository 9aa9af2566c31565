package tui

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"time"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/kpproxy/kp/explain"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// explainRequest asks for kp explain's answer about one packet: a Service
// port's address, or a flow's destination from its source.
type explainRequest struct {
	packet explain.Packet
	// what names it in the header: a Service port, or a flow.
	what string
	err  error // the row cannot be explained (a protocol kp explain lacks)
}

// showExplainMsg asks the root to open the explanation of a request.
type showExplainMsg struct{ req explainRequest }

func showExplain(req explainRequest) tea.Cmd { return func() tea.Msg { return showExplainMsg{req} } }

// explainedMsg is kp explain's answer, read for a request.
type explainedMsg struct {
	packet explain.Packet
	text   string
	err    error
	at     time.Time
}

// readExplanation reads kp proxy's snapshot (the model kp explain reads
// live) and explains p with the explain package, as kp explain does.
func readExplanation(src Source, p explain.Packet, o explain.Options, timeout time.Duration, now func() time.Time) tea.Cmd {
	return func() tea.Msg {
		msg := explainedMsg{packet: p}
		msg.text, msg.err = explainText(src, p, o, timeout)
		msg.at = now()
		return msg
	}
}

func explainText(src Source, p explain.Packet, o explain.Options, timeout time.Duration) (string, error) {
	if src == nil {
		return "", errors.New("nothing to read the explanation from")
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	snap, err := src.Snapshot(ctx)
	if err != nil {
		return "", err
	}
	if snap == nil || snap.Format != statusapi.SnapshotFormat {
		return "", fmt.Errorf("kp proxy answered no snapshot (an older kp? its status API lacks %s)", statusapi.SnapshotPath)
	}
	m, err := explain.FromSnapshot(snap)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	if err := explain.Write(&b, explain.Explain(m, p, o)); err != nil {
		return "", err
	}
	return b.String(), nil
}

// servicePacket is the packet kp top explains for a Service port: to its
// first address (ClusterIP, else external or LoadBalancer IP), else to its
// NodePort on the node's first address.
func servicePacket(sp statusapi.ServicePort, nodeIPs []string) explainRequest {
	req := explainRequest{what: keyOf(sp).String()}
	proto := "/" + strings.ToLower(sp.Protocol)
	for _, a := range addresses(sp) {
		if ip, err := netip.ParseAddr(a); err == nil {
			req.packet, req.err = explain.ParsePacket(netip.AddrPortFrom(ip, uint16(sp.Port)).String()+proto, "")
			return req
		}
	}
	for _, a := range nodeIPs {
		if ip, err := netip.ParseAddr(a); err == nil && sp.NodePort != 0 {
			req.packet, req.err = explain.ParsePacket(netip.AddrPortFrom(ip, uint16(sp.NodePort)).String()+proto, "")
			return req
		}
	}
	req.err = fmt.Errorf("%s has no address to explain", req.what)
	return req
}

// flowPacket is the packet of a flow's row: its destination, from its
// client.
func flowPacket(id flowRowID) explainRequest {
	req := explainRequest{what: "flow " + id.client + " → " + id.dst}
	req.packet, req.err = explain.ParsePacket(id.dst+"/"+strings.ToLower(id.proto), id.client)
	return req
}

// explainPage shows kp explain's answer, scrolled with the cursor keys;
// the filter keeps the lines it matches, and x reads it again.
type explainPage struct {
	c      *Common
	req    explainRequest
	text   string
	err    error
	at     time.Time
	filter *regexp.Regexp
	offset int
	h      int
}

func newExplainPage(c *Common, req explainRequest) *explainPage {
	return &explainPage{c: c, req: req}
}

func (p *explainPage) name() string { return "explain " + p.req.packet.String() }

func (p *explainPage) answer(msg explainedMsg) {
	p.text, p.err, p.at = msg.text, msg.err, msg.at
}

func (p *explainPage) refresh()                    {}
func (p *explainPage) setFilter(re *regexp.Regexp) { p.filter, p.offset = re, 0 }
func (p *explainPage) sortKeys() []sortKey         { return nil }
func (p *explainPage) SetSize(_, h int)            { p.h = h; p.scroll(0) }

// lines are the answer wrapped to the width, filtered.
func (p *explainPage) lines() []string {
	var out []string
	for _, l := range strings.Split(strings.TrimRight(p.text, "\n"), "\n") {
		if p.filter != nil && !p.filter.MatchString(l) {
			continue
		}
		out = append(out, strings.Split(ansi.Wrap(l, max(p.c.Width, 10), " "), "\n")...)
	}
	return out
}

func (p *explainPage) scroll(n int) {
	room := max(p.h-1, 1)
	p.offset = max(min(p.offset+n, len(p.lines())-room), 0)
}

func (p *explainPage) Update(msg tea.Msg) tea.Cmd {
	km, ok := msg.(tea.KeyPressMsg)
	if !ok {
		return nil
	}
	k := p.c.Keys
	page := max(p.h-2, 1)
	switch {
	case key.Matches(km, k.Up):
		p.scroll(-1)
	case key.Matches(km, k.Down):
		p.scroll(1)
	case key.Matches(km, k.PageUp):
		p.scroll(-page)
	case key.Matches(km, k.PageDown):
		p.scroll(page)
	case key.Matches(km, k.Top):
		p.scroll(-p.offset)
	case key.Matches(km, k.Bottom):
		p.scroll(len(p.lines()))
	case key.Matches(km, k.Explain):
		return showExplain(p.req)
	}
	return nil
}

func (p *explainPage) View() string {
	st := p.c.Styles
	head := st.Title.Render("kp explain "+p.req.packet.String()) + "  " + p.req.what
	switch {
	case p.err != nil:
		return head + "\n" + st.Error.Render(ansi.Wrap("cannot explain: "+p.err.Error(), max(p.c.Width, 10), " "))
	case p.at.IsZero():
		return head + "\n" + st.Faint.Render("reading kp proxy's snapshot…")
	}
	head += st.Faint.Render("  read " + p.at.Format(time.TimeOnly))
	lines := p.lines()
	room := max(p.h-1, 1)
	end := min(p.offset+room, len(lines))
	return head + "\n" + strings.Join(lines[min(p.offset, end):end], "\n")
}
