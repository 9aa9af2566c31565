package tui

import (
	"fmt"
	"strings"

	"charm.land/bubbles/v2/key"
)

// helpView lists the keys: the global ones and the sort keys of the page
// help was opened from.
func helpView(c *Common, from page) string {
	st := c.Styles
	k := c.Keys
	line := func(b key.Binding) string {
		h := b.Help()
		return fmt.Sprintf("  %s %s", st.Key.Render(fmt.Sprintf("%-8s", h.Key)), h.Desc)
	}
	var left, right []string
	left = append(left, st.Title.Render("keys"))
	for _, b := range []key.Binding{k.Help, k.Filter, k.Command, k.Enter, k.Explain, k.Back, k.Up, k.Down, k.PageUp, k.PageDown, k.Top, k.Bottom, k.Quit} {
		left = append(left, line(b))
	}
	if sorts := from.sortKeys(); len(sorts) > 0 {
		right = append(right, st.Title.Render("sort "+from.name()+" (again: reverse)"))
		for _, s := range sorts {
			right = append(right, line(s.Binding))
		}
	}
	right = append(right, "", st.Title.Render("commands"),
		"  :svc     Services", "  :flows   conntrack flows", "  :q       quit",
		"", st.Faint.Render("esc or ? closes this help"))
	var b strings.Builder
	for i := 0; i < max(len(left), len(right)); i++ {
		var l, r string
		if i < len(left) {
			l = left[i]
		}
		if i < len(right) {
			r = right[i]
		}
		b.WriteString(pad(cell(l, 38, false)+" "+r, c.Width))
		if i < max(len(left), len(right))-1 {
			b.WriteString("\n")
		}
	}
	return b.String()
}
