package bench

import (
	"strings"
	"testing"
)

func TestIPVSTargetsJudgeColdStartSyncAndRSSAgainstUpstreamIPVS(t *testing.T) {
	run := func(kpCold, upCold, kpSync, upSync float64, kpRSS, upRSS int64) *Results {
		return &Results{Ns: []int{1000}, Machine: Machine{VM: "qemu TCG"},
			FullSyncs: []FullSync{
				{Proxy: KPIPVS, N: 1000, Seconds: kpCold, PeakRSS: kpRSS - 2<<20, ChildRSS: 2 << 20},
				{Proxy: UpstreamIPVS, N: 1000, Seconds: upCold, PeakRSS: upRSS - 8<<20, ChildRSS: 8 << 20},
			},
			Incrementals: []Incremental{{Proxy: KPIPVS, N: 1000, SyncSeconds: kpSync}, {Proxy: UpstreamIPVS, N: 1000, SyncSeconds: upSync}},
		}
	}
	for _, c := range []struct {
		name string
		r    *Results
		want map[string]string // row's prefix -> substrings its line must hold, "|"-separated
	}{
		{
			name: "kp 5× faster, a tenth of the sync, smaller",
			r:    run(2, 10, 0.01, 0.1, 40<<20, 60<<20),
			want: map[string]string{
				"| cold start ≥ 5× faster than upstream ipvs mode": "kp-ipvs 2.00 s; upstream-ipvs 10.00 s: upstream / kp-ipvs = 5.00|✓ met",
				"| one endpoint change: kp-ipvs's own sync ≤ 1/10": "kp-ipvs 10.0 ms, upstream-ipvs 100.0 ms: 0.10|✓ met",
				"| peak RSS (process + its ipset":                  "kp-ipvs 40.0 MiB vs upstream-ipvs 60.0 MiB: 0.67|✓ met",
				"In a software-emulated VM":                        "the ratios are what count",
			},
		},
		{
			name: "kp too slow, its syncs too long, bigger",
			r:    run(4, 10, 0.05, 0.1, 80<<20, 60<<20),
			want: map[string]string{
				"| cold start":    "= 2.50|✗ missed",
				"| one endpoint":  ": 0.50|✗ missed",
				"| peak RSS (pro": ": 1.33|✗ missed",
			},
		},
	} {
		b := &strings.Builder{}
		writeIPVSTargets(b, c.r, 1000)
		checkRows(t, c.name, b.String(), c.want)
	}
}
