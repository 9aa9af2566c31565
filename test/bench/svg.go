package bench

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// series is one line of a panel: a proxy's medians against N.
type series struct {
	name   string
	color  string
	points [][2]float64 // N, value
}

var colors = map[string]string{
	KP: "#1b9e77", UpstreamNFT: "#d95f02", KPIPTables: "#e7298a", UpstreamIPTables: "#7570b3", KPIPTablesLegacy: "#f781bf", UpstreamIPTablesLegacy: "#9e9ac8", KPUserspace: "#66a61e", KPIPVS: "#e6ab02", UpstreamIPVS: "#a6761d", NoProxy: "#666666",
}

// WritePlot draws two panels as SVG: full-sync time against N (log-log) and
// the data path's connection rate against N (log N, linear rate from 0).
func WritePlot(w io.Writer, r *Results) error {
	var sync, rate []series
	for _, p := range Proxies {
		s := series{name: p, color: colors[p]}
		for _, n := range r.sortedNs() {
			if v := Median(r.fullSync(p, n, func(f FullSync) float64 { return f.Seconds })); known(v) {
				s.points = append(s.points, [2]float64{float64(n), v})
			}
		}
		sync = append(sync, s)
	}
	for _, p := range append([]string{NoProxy}, Proxies...) {
		s := series{name: p, color: colors[p]}
		for _, n := range r.sortedNs() {
			if v := Median(r.dataPath(p, n)); known(v) {
				s.points = append(s.points, [2]float64{float64(n), v})
			}
		}
		rate = append(rate, s)
	}
	b := &strings.Builder{}
	const width, height = 960, 400
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		width, height, width, height)
	fmt.Fprintf(b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	panel(b, 0, "Full sync: start to all Services programmed (s, log)", sync, true)
	panel(b, width/2, "New TCP connections per second via one ClusterIP", rate, false)
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// panel draws one plot in a 480×400 box at x0.
func panel(b *strings.Builder, x0 int, title string, ss []series, logY bool) {
	const left, right, top, bottom = 70, 20, 40, 90
	const w, h = 480 - left - right, 400 - top - bottom
	minN, maxN, minV, maxV := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range ss {
		for _, p := range s.points {
			minN, maxN = math.Min(minN, p[0]), math.Max(maxN, p[0])
			minV, maxV = math.Min(minV, p[1]), math.Max(maxV, p[1])
		}
	}
	fmt.Fprintf(b, `<text x="%d" y="22" font-weight="bold">%s</text>`+"\n", x0+left-40, title)
	if math.IsInf(minN, 0) {
		fmt.Fprintf(b, `<text x="%d" y="%d">no data</text>`+"\n", x0+left+w/2-25, top+h/2)
		return
	}
	lx := func(n float64) float64 { return math.Log10(math.Max(n, 1)) }
	xLo, xHi := math.Floor(lx(minN)), math.Ceil(lx(maxN))
	if xHi == xLo {
		xHi++
	}
	yf := func(v float64) float64 { return v }
	yLo, yHi := 0.0, maxV*1.1
	if logY {
		yf = func(v float64) float64 { return math.Log10(math.Max(v, 1e-6)) }
		yLo, yHi = math.Floor(yf(minV)), math.Ceil(yf(maxV))
		if yHi == yLo {
			yHi++
		}
	}
	if yHi <= yLo {
		yHi = yLo + 1
	}
	px := func(n float64) float64 { return float64(x0+left) + (lx(n)-xLo)/(xHi-xLo)*w }
	py := func(v float64) float64 { return float64(top) + h - (yf(v)-yLo)/(yHi-yLo)*h }
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/>`+"\n", x0+left, top, w, h)
	for e := xLo; e <= xHi; e++ {
		x := px(math.Pow(10, e))
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/>`, x, top, x, top+h)
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, top+h+16, fmtN(int(math.Pow(10, e))))
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">Services (N, log)</text>`+"\n", x0+left+w/2, top+h+34)
	for i := 0; i <= 4; i++ {
		yv := yLo + (yHi-yLo)*float64(i)/4
		v := yv
		if logY {
			v = math.Pow(10, yv)
		}
		y := float64(top) + h - float64(i)/4*h
		label := fmt.Sprintf("%.0f", v)
		if logY {
			label = fmtSeconds(v)
		}
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>`, x0+left, y, x0+left+w, y)
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", x0+left-4, y+4, label)
	}
	for i, s := range ss {
		if len(s.points) == 0 {
			continue
		}
		var pts []string
		for _, p := range s.points {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(p[0]), py(p[1])))
			fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`, px(p[0]), py(p[1]), s.color)
		}
		fmt.Fprintf(b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(pts, " "), s.color)
		lyy := top + h + 52 + (i/2)*16
		lxx := x0 + left + (i%2)*190
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="12" height="3" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n",
			lxx, lyy-4, s.color, lxx+16, lyy, s.name)
	}
}
