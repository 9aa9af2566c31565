package tui

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// unknown is how a number kp top cannot know yet is shown.
const unknown = "-"

// rate formats a per-second rate; NaN is unknown.
func rate(v float64) string {
	switch {
	case math.IsNaN(v):
		return unknown
	case v == 0:
		return "0"
	case v < 10:
		return fmt.Sprintf("%.1f", v)
	}
	return si(v, "")
}

// byteRate formats bytes per second.
func byteRate(v float64) string {
	if math.IsNaN(v) {
		return unknown
	}
	return si(v, "B")
}

// si formats v with a k, M or G suffix.
func si(v float64, unit string) string {
	for _, p := range []struct {
		n float64
		s string
	}{{1e9, "G"}, {1e6, "M"}, {1e3, "k"}} {
		if v >= p.n {
			return fmt.Sprintf("%.1f%s%s", v/p.n, p.s, unit)
		}
	}
	return fmt.Sprintf("%.0f%s", v, unit)
}

func countOrUnknown(n *uint64) (string, float64) {
	if n == nil {
		return unknown, -1
	}
	return si(float64(*n), ""), float64(*n)
}

// ageOf formats an age in seconds the way kubectl does: 45s, 3m12s, 2h5m.
func ageOf(s *float64) (string, float64) {
	if s == nil {
		return unknown, -1
	}
	d := time.Duration(*s * float64(time.Second)).Round(time.Second)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds())), *s
	case d < time.Hour:
		return fmt.Sprintf("%dm%ds", int(d.Minutes()), int(d.Seconds())%60), *s
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60), *s
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24)), *s
}

// bar draws a share in [0,1] as w cells.
func bar(share float64, w int) string {
	if w <= 0 {
		return ""
	}
	if math.IsNaN(share) || share < 0 {
		share = 0
	}
	full := int(math.Round(share * float64(w)))
	if full > w {
		full = w
	}
	// Any traffic at all shows at least one cell: an idle backend must
	// look different from a quiet one.
	if full == 0 && share > 0 {
		full = 1
	}
	return strings.Repeat("█", full) + strings.Repeat("·", w-full)
}

func percent(share float64) string {
	if math.IsNaN(share) {
		return unknown
	}
	return fmt.Sprintf("%.0f%%", share*100)
}
