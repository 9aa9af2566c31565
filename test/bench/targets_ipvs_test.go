package bench

import (
	"strings"
	"testing"
)

func TestIPVSTargetsJudgeColdStartSyncAndRSSAgainstUpstreamIPVS(t *testing.T) {
	run := func(upOverKP, upSync float64, kpRSS, upRSS int64) *Results {
		r := &Results{Run: Run{ID: "run", Commit: "c"}, Ns: []int{1000}, Machine: Machine{VM: "qemu TCG"}}
		kp := []float64{2, 2.1, 1.9, 2, 2}
		coldStarts(r, KPIPVS, 1000, kp, kpRSS-2<<20, 2<<20)
		coldStarts(r, UpstreamIPVS, 1000, scaled(kp, upOverKP), upRSS-8<<20, 8<<20)
		changes(r, KPIPVS, 1000, 0.010, 0.011, 0.009, 0.010, 0.010)
		changes(r, UpstreamIPVS, 1000, scaled([]float64{0.010, 0.011, 0.009, 0.010, 0.010}, upSync)...)
		return r
	}
	for _, c := range []struct {
		name string
		r    *Results
		want map[string]string // row's prefix -> substrings its line must hold, "|"-separated
	}{
		{
			name: "kp 6× faster, a twentieth of the sync, smaller",
			r:    run(6, 20, 40<<20, 60<<20),
			want: map[string]string{
				"| cold start ≥ 5× faster than upstream ipvs mode": "kp-ipvs 2.00 s, upstream-ipvs 12.00 s (medians); upstream / kp-ipvs by round: 6.00|✓ met",
				"| one endpoint change: kp-ipvs's own sync ≤ 1/10": "kp-ipvs 10.0 ms, upstream-ipvs 199.6 ms; ratio 0.050|✓ met",
				"| peak RSS (process + its ipset":                  "kp-ipvs 40.0 MiB vs upstream-ipvs 60.0 MiB (medians); by round: 0.67|✓ met",
				"In a software-emulated VM":                        "the ratios are what count",
			},
		},
		{
			name: "kp too slow, its syncs too long, bigger",
			r:    run(2.5, 2, 80<<20, 60<<20),
			want: map[string]string{
				"| cold start":    "by round: 2.50|✗ missed",
				"| one endpoint":  "ratio 0.50|✗ missed",
				"| peak RSS (pro": "by round: 1.33|✗ missed",
			},
		},
	} {
		b := &strings.Builder{}
		writeIPVSTargets(b, c.r, 1000)
		checkRows(t, c.name, b.String(), c.want)
	}
}
