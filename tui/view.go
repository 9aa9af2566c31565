package tui

import (
	"fmt"
	"strings"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"
)

// View draws the screen: a header, the page (or the help), a footer.
func (m *Model) View() tea.View {
	v := tea.NewView(m.Render())
	v.AltScreen = true
	return v
}

// Render is the screen as text, which the golden tests compare.
func (m *Model) Render() string {
	lines := m.header()
	body := ""
	if m.help {
		body = helpView(m.c, m.current())
	} else {
		body = m.current().View()
	}
	bodyLines := strings.Split(body, "\n")
	room := m.c.Height - len(lines) - 1
	for i := 0; i < room; i++ {
		l := ""
		if i < len(bodyLines) {
			l = bodyLines[i]
		}
		lines = append(lines, l)
	}
	lines = append(lines, m.footer())
	for i, l := range lines {
		lines[i] = pad(l, m.c.Width)
	}
	return strings.Join(lines, "\n")
}

// header is the first lines: where kp top looks, when it last read, and
// what cannot be reached.
func (m *Model) header() []string {
	st := m.c.Styles
	s := m.s
	node, mode := "?", "?"
	if s.status != nil {
		node, mode = s.status.Node, s.status.Mode
		if c := s.status.ModeChoice; c != nil && c.Auto {
			// auto fell back: which modes the node refused
			mode += " (auto"
			for _, r := range c.Refused {
				mode += ", no " + r.Mode
			}
			mode += ")"
		}
	}
	top := fmt.Sprintf("kp top  node %s  mode %s  refresh %s", node, mode, m.cfg.Refresh)
	if !s.statusAt.IsZero() {
		top += "  read " + s.statusAt.Format("15:04:05")
	}
	if s.status != nil && !s.status.Healthy {
		// kp proxy's /healthz would fail: its last sync is too old.
		top += "  NOT HEALTHY"
	}
	lines := []string{st.Header.Render(top)}

	crumb := fmt.Sprintf("<%s>", m.crumb(len(m.stack)-1))
	if m.filter != "" {
		crumb += fmt.Sprintf("  filter /%s/", m.filter)
	}
	if m.help {
		crumb += "  help"
	}
	lines = append(lines, crumb)
	retry := fmt.Sprintf(" (retrying every %s)", m.cfg.Refresh)
	// Errors are wrapped, not cut: their end says what to do.
	problem := func(s string) {
		for _, l := range strings.Split(ansi.Wrap(s, m.c.Width, " "), "\n") {
			lines = append(lines, st.Error.Render(l))
		}
	}
	if s.statusErr != nil {
		what := "cannot reach kp proxy's status API: "
		if s.services != nil {
			what = fmt.Sprintf("status API unreachable, showing the read of %s: ", s.statusAt.Format(time.TimeOnly))
		}
		problem(what + s.statusErr.Error() + retry)
	}
	if s.services != nil && s.services.CountersError != "" {
		problem("kp proxy cannot read its per-endpoint counters: " + s.services.CountersError)
	}
	if s.conntrackErr != nil {
		problem("cannot read conntrack: " + s.conntrackErr.Error() + retry)
	} else if s.watchErr != nil {
		problem("conntrack event stream broke: " + s.watchErr.Error() + retry)
	}
	if m.notice != "" {
		problem(m.notice)
	}
	return lines
}

// crumb names the page at stack[i], after the pages it was opened from.
func (m *Model) crumb(i int) string {
	switch p := m.stack[i].(type) {
	case *detailPage:
		return "services › " + p.sp.String()
	case *explainPage:
		if i > 0 {
			return m.crumb(i-1) + " › " + p.name()
		}
	}
	return m.stack[i].name()
}

func (m *Model) footer() string {
	st := m.c.Styles
	switch m.mode {
	case inputFilter:
		return "/" + m.input.View()
	case inputCommand:
		return ":" + m.input.View()
	}
	hint := func(k, d string) string { return st.Key.Render(k) + " " + d }
	parts := []string{hint("?", "help"), hint("/", "filter"), hint(":", "svc|flows")}
	switch m.current().(type) {
	case *detailPage:
		parts = append(parts, hint("x", "explain"))
	case *explainPage:
		parts = append(parts, hint("x", "read again"))
	default:
		parts = append(parts, hint("enter", "detail"), hint("x", "explain"))
	}
	parts = append(parts, hint("esc", "back"), hint("q", "quit"))
	return strings.Join(parts, "  ")
}
