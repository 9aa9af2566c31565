package tui

import (
	"math"
	"sort"
	"strings"

	"github.com/charmbracelet/x/ansi"
)

// column describes one column of a table.
type column struct {
	title string
	// width is the column's width; 0 makes it flexible, sharing what the
	// fixed columns leave, at least min.
	width, min int
	right      bool
	// drop orders which columns go first when the terminal is too narrow
	// for all: the highest first; 0 never goes.
	drop int
}

// row is one line of a table: its cells, the numbers numeric columns sort
// by (NaN for text columns), and what it shows, to keep the cursor on it
// across refreshes.
type row struct {
	cells []string
	nums  []float64
	id    any
	// alert highlights the row: it shows something wrong.
	alert bool
}

// table is a scrollable list of rows with a cursor, sortable by column.
type table struct {
	cols           []column
	rows           []row
	cursor, offset int
	height         int
	sortCol        int
	desc           bool
}

// setRows replaces the rows, keeping the cursor on the row it was on.
func (t *table) setRows(rows []row) {
	var sel any
	if r := t.selected(); r != nil {
		sel = r.id
	}
	t.rows = rows
	t.sort()
	for i, r := range t.rows {
		if sel != nil && r.id == sel {
			t.cursor = i
		}
	}
	t.clamp()
}

func (t *table) sort() {
	c := t.sortCol
	less := func(a, b row) bool {
		if a.nums != nil && b.nums != nil && !math.IsNaN(a.nums[c]) && !math.IsNaN(b.nums[c]) {
			if a.nums[c] != b.nums[c] {
				return a.nums[c] < b.nums[c]
			}
		} else if a.cells[c] != b.cells[c] {
			return a.cells[c] < b.cells[c]
		}
		return strings.Join(a.cells, " ") < strings.Join(b.cells, " ")
	}
	sort.SliceStable(t.rows, func(i, j int) bool {
		if t.desc {
			return less(t.rows[j], t.rows[i])
		}
		return less(t.rows[i], t.rows[j])
	})
}

// sortBy sorts by col; sorting again by the same column reverses.
func (t *table) sortBy(col int) {
	if t.sortCol == col {
		t.desc = !t.desc
	} else {
		t.sortCol, t.desc = col, false
	}
	t.sort()
}

func (t *table) move(n int) {
	t.cursor += n
	t.clamp()
}

func (t *table) clamp() {
	if t.cursor >= len(t.rows) {
		t.cursor = len(t.rows) - 1
	}
	if t.cursor < 0 {
		t.cursor = 0
	}
	h := t.height - 1 // the header
	if h < 1 {
		h = 1
	}
	if t.cursor < t.offset {
		t.offset = t.cursor
	}
	if t.cursor >= t.offset+h {
		t.offset = t.cursor - h + 1
	}
	if max := len(t.rows) - h; t.offset > max {
		t.offset = max
	}
	if t.offset < 0 {
		t.offset = 0
	}
}

func (t *table) selected() *row {
	if t.cursor < 0 || t.cursor >= len(t.rows) {
		return nil
	}
	return &t.rows[t.cursor]
}

// layout picks the columns that fit in width and their widths. Flexible
// columns grow, in order, up to their widest cell (want); what is left
// after that is spread evenly.
func layout(cols []column, want []int, width int) (idx []int, widths []int) {
	for i := range cols {
		idx = append(idx, i)
	}
	// A column that never goes may claim a little more than its minimum
	// when its cells need it, before optional columns are kept.
	floor := func(i int) int {
		c := cols[i]
		switch {
		case c.width > 0:
			return c.width
		case c.drop == 0:
			return max(c.min, min(want[i], c.min+8))
		}
		return c.min
	}
	need := func() int {
		n := len(idx) - 1 // one space between columns
		for _, i := range idx {
			n += floor(i)
		}
		return n
	}
	for need() > width {
		worst := -1
		for j, i := range idx {
			if cols[i].drop > 0 && (worst < 0 || cols[i].drop > cols[idx[worst]].drop) {
				worst = j
			}
		}
		if worst < 0 {
			break
		}
		idx = append(idx[:worst], idx[worst+1:]...)
	}
	spare, flex := width-need(), 0
	for _, i := range idx {
		w := cols[i].width
		if w == 0 {
			flex++
			w = floor(i)
			if grow := min(want[i]-w, spare); grow > 0 {
				w += grow
				spare -= grow
			}
		}
		widths = append(widths, w)
	}
	for j, i := range idx {
		if cols[i].width == 0 && spare > 0 {
			extra := spare / flex
			widths[j] += extra
			spare -= extra
			flex--
		}
	}
	return idx, widths
}

// View renders the table in width columns and its height in lines; the
// cursor's row is highlighted when focused.
func (t *table) View(st *Styles, width int, focused bool) string {
	want := make([]int, len(t.cols))
	for i, c := range t.cols {
		want[i] = ansi.StringWidth(c.title)
		if i == t.sortCol {
			want[i]++ // the arrow
		}
	}
	for _, r := range t.rows {
		for i, c := range r.cells {
			want[i] = max(want[i], ansi.StringWidth(c))
		}
	}
	idx, widths := layout(t.cols, want, width)
	var b strings.Builder
	hdr := make([]string, len(idx))
	for j, i := range idx {
		title := t.cols[i].title
		if i == t.sortCol {
			// The arrow must show even when the title fills the column.
			arrow := "↑"
			if t.desc {
				arrow = "↓"
			}
			title = ansi.Truncate(title, widths[j]-1, "") + arrow
		}
		hdr[j] = cell(title, widths[j], t.cols[i].right)
	}
	b.WriteString(st.TableHeader.Render(pad(strings.Join(hdr, " "), width)))
	lines := 1
	for r := t.offset; r < len(t.rows) && lines < t.height; r++ {
		cells := make([]string, len(idx))
		for j, i := range idx {
			cells[j] = cell(t.rows[r].cells[i], widths[j], t.cols[i].right)
		}
		line := pad(strings.Join(cells, " "), width)
		switch {
		case focused && r == t.cursor:
			line = st.Selected.Render(line)
		case t.rows[r].alert:
			line = st.Alert.Render(line)
		}
		b.WriteString("\n" + line)
		lines++
	}
	return b.String()
}

// cell fits s into w columns, cutting it with an ellipsis.
func cell(s string, w int, right bool) string {
	s = ansi.Truncate(s, w, "…")
	gap := w - ansi.StringWidth(s)
	if gap <= 0 {
		return s
	}
	if right {
		return strings.Repeat(" ", gap) + s
	}
	return s + strings.Repeat(" ", gap)
}

// pad fills or cuts s to exactly w columns.
func pad(s string, w int) string { return cell(s, w, false) }
