package bench

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

func fmtMBps(v float64) string {
	if !known(v) {
		return "–"
	}
	return fmt.Sprintf("%.0f", v)
}

// comparisons are those of the comparisons whose two proxies r measured.
func (r *Results) comparisons() []comparison {
	proxies := r.proxies()
	var out []comparison
	for _, c := range comparisons {
		if slices.Contains(proxies, c.kp) && slices.Contains(proxies, c.upstream) {
			out = append(out, c)
		}
	}
	return out
}

func stringsOf[T fmt.Stringer](xs []T) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = x.String()
	}
	return out
}

// tableHead writes a Markdown table's header, every column right-aligned
// (they hold numbers).
func tableHead(b *strings.Builder, cols []string) {
	tableRow(b, cols)
	b.WriteString("|---:" + strings.Repeat("|---:", len(cols)-1) + "|\n")
}

func tableRow(b *strings.Builder, cells []string) {
	b.WriteString("| " + strings.Join(cells, " | ") + " |\n")
}

func fmtPercent(v float64) string {
	if !known(v) {
		return "–"
	}
	return fmt.Sprintf("%.1f%%", v*100)
}

func known(xs ...float64) bool {
	for _, x := range xs {
		if math.IsNaN(x) || math.IsInf(x, 0) || x == 0 {
			return false
		}
	}
	return true
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmtN(x)
	}
	return strings.Join(s, ", ")
}

// fmtN writes 10000 as 10,000.
func fmtN(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func fmtSeconds(s float64) string {
	switch {
	case !known(s) && s != 0:
		return "–"
	case s < 0: // a lower bound
		return "> " + fmtSeconds(-s)
	case s < 0.001:
		return fmt.Sprintf("%.0f µs", s*1e6)
	case s < 1:
		return fmt.Sprintf("%.1f ms", s*1e3)
	default:
		return fmt.Sprintf("%.2f s", s)
	}
}

func fmtBytes(v float64) string {
	if !known(v) {
		return "–"
	}
	return fmt.Sprintf("%.1f MiB", v/(1<<20))
}

func fmtCount(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return fmt.Sprintf("%.0f", v)
}

func fmtRate(v float64) string {
	if !known(v) {
		return "–"
	}
	return fmt.Sprintf("%.0f/s", v)
}

func fmtRatio(v float64) string {
	if !known(v) {
		return "–"
	}
	if v < 0 { // over a lower bound (an unfinished cold start)
		return "< " + fmtRatio(-v)
	}
	if v < 0.1 {
		return fmt.Sprintf("%.3f", v)
	}
	return fmt.Sprintf("%.2f", v)
}
