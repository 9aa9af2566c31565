package tui

import (
	"regexp"
	"strings"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
)

// page is a component the root can show full screen: it lists rows from
// the store, filters and sorts them.
type page interface {
	component
	// name is the page's name in the header and in : commands.
	name() string
	// refresh rebuilds the page's rows from the store.
	refresh()
	setFilter(re *regexp.Regexp)
	sortKeys() []sortKey
}

// showDetailMsg asks the root to open a Service port's detail.
type showDetailMsg struct{ sp spKey }

func showDetail(k spKey) tea.Cmd { return func() tea.Msg { return showDetailMsg{k} } }

// tablePage is what the list pages share: a table with cursor keys, sort
// keys and a filter over the text of each row.
type tablePage struct {
	c      *Common
	s      *store
	t      table
	sorts  []sortKey
	filter *regexp.Regexp
	// detailOf names the Service port a row drills down to; nil when
	// enter does nothing.
	detailOf func(r *row) spKey
	// explainOf is the packet kp explain answers for a row; nil when x
	// does nothing.
	explainOf func(r *row) explainRequest
}

// Update moves the cursor, sorts, drills down on enter and explains on x.
func (p *tablePage) Update(msg tea.Msg) tea.Cmd {
	km, ok := msg.(tea.KeyPressMsg)
	if !ok || p.navigate(km) {
		return nil
	}
	r := p.t.selected()
	switch {
	case r == nil:
	case p.detailOf != nil && key.Matches(km, p.c.Keys.Enter):
		return showDetail(p.detailOf(r))
	case p.explainOf != nil && key.Matches(km, p.c.Keys.Explain):
		return showExplain(p.explainOf(r))
	}
	return nil
}

// navigate handles the cursor and sort keys; it reports whether msg was
// one of them.
func (p *tablePage) navigate(msg tea.KeyPressMsg) bool {
	k := p.c.Keys
	page := p.t.height - 2
	if page < 1 {
		page = 1
	}
	switch {
	case key.Matches(msg, k.Up):
		p.t.move(-1)
	case key.Matches(msg, k.Down):
		p.t.move(1)
	case key.Matches(msg, k.PageUp):
		p.t.move(-page)
	case key.Matches(msg, k.PageDown):
		p.t.move(page)
	case key.Matches(msg, k.Top):
		p.t.move(-len(p.t.rows))
	case key.Matches(msg, k.Bottom):
		p.t.move(len(p.t.rows))
	default:
		for _, s := range p.sorts {
			if key.Matches(msg, s.Binding) {
				p.t.sortBy(s.col)
				return true
			}
		}
		return false
	}
	return true
}

// keep applies the filter to a row's cells.
func (p *tablePage) keep(cells []string) bool {
	return p.filter == nil || p.filter.MatchString(strings.Join(cells, " "))
}

func (p *tablePage) setFilter(re *regexp.Regexp) { p.filter = re }
func (p *tablePage) sortKeys() []sortKey         { return p.sorts }
func (p *tablePage) SetSize(w, h int)            { p.t.height = h; p.t.clamp() }

// view draws the table, or says why it is empty: waiting (not read yet)
// when not "", else noMatch under a filter, else none.
func (p *tablePage) view(waiting, noMatch, none string) string {
	if waiting != "" {
		return p.c.Styles.Faint.Render(waiting)
	}
	v := p.t.View(p.c.Styles, p.c.Width, true)
	switch {
	case len(p.t.rows) > 0:
		return v
	case p.filter != nil:
		return v + "\n" + p.c.Styles.Faint.Render(noMatch)
	}
	return v + "\n" + p.c.Styles.Faint.Render(none)
}
