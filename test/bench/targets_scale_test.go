package bench

import (
	"slices"
	"strings"
	"testing"
)

// scaleResults is a run of kp and upstream nftables mode at N = 1 and n:
// upstream's cold start at n took upSeconds, or ran into that limit when
// upUnfinished (and then measured nothing else there).
func scaleResults(n int, kpSeconds, upSeconds float64, upUnfinished bool, kpRSS, upRSS int64, kpRate float64) *Results {
	r := &Results{Ns: []int{1, n}}
	r.FullSyncs = []FullSync{
		{Proxy: KP, N: 1, Seconds: 0.2, PeakRSS: 40 << 20},
		{Proxy: UpstreamNFT, N: 1, Seconds: 1.5, PeakRSS: 58 << 20},
		{Proxy: KP, N: n, Seconds: kpSeconds, PeakRSS: kpRSS},
		{Proxy: UpstreamNFT, N: n, Seconds: upSeconds, PeakRSS: upRSS, ChildRSS: 300 << 20, Unfinished: upUnfinished},
	}
	r.Incrementals = []Incremental{{Proxy: KP, N: n, SyncSeconds: 0.004}, {Proxy: KP, N: n, SyncSeconds: 0.006},
		{Proxy: KP, N: n, SyncSeconds: 0.003}}
	r.Idles = []Idle{{Proxy: KP, N: n, RSS: kpRSS - 10<<20}}
	r.DataPaths = []DataPath{{Proxy: KP, N: 1, ConnPerSec: 4000}, {Proxy: UpstreamNFT, N: 1, ConnPerSec: 3900},
		{Proxy: KP, N: n, ConnPerSec: kpRate}}
	if !upUnfinished {
		r.Idles = append(r.Idles, Idle{Proxy: UpstreamNFT, N: n, RSS: upRSS - 10<<20})
		r.DataPaths = append(r.DataPaths, DataPath{Proxy: UpstreamNFT, N: n, ConnPerSec: 3800})
	}
	return r
}

func TestScaleTargetsJudgeEachRowAndUpstreamsBounds(t *testing.T) {
	for _, c := range []struct {
		name string
		r    *Results
		n    int
		want map[string]string // row's target prefix -> substrings its line must hold
	}{
		{
			name: "both finished: fast, small, and at upstream's rate",
			r:    scaleResults(10000, 2, 30, false, 90<<20, 300<<20, 3900),
			n:    10000,
			want: map[string]string{
				"| cold start":               "upstream / kp = 15.00|✓ met",
				"| one endpoint change":      "median 4.0 ms|✓ met",
				"| peak RSS (process alone)": "90.0 MiB vs 300.0 MiB (⅓: 100.0 MiB)|✓ met",
				"| idle RSS":                 "80.0 MiB vs 290.0 MiB|✓ met",
				"| new connections/s":        "N = 1: 4000/s vs 3900/s|N = 10,000: 3900/s vs 3800/s|✓ met",
				"| kp's new connections/s":   "3900/s vs 4000/s: 97.5%|✓ met",
			},
		},
		{
			name: "both finished: kp too big and slower per connection at N",
			r:    scaleResults(10000, 8, 30, false, 126<<20, 277<<20, 3500),
			n:    10000,
			want: map[string]string{
				"| cold start":               "= 3.75|✗ missed",
				"| peak RSS (process alone)": "126.0 MiB vs 277.0 MiB|✗ missed",
				"| new connections/s":        "N = 10,000: 3500/s vs 3800/s, 0.92|✗ missed",
				"| kp's new connections/s":   "87.5%|✗ missed",
			},
		},
		{
			name: "upstream ran out of time at 30,000: its bounds settle only what they can",
			r:    scaleResults(30000, 20, 360, true, 400<<20, 900<<20, 3900),
			n:    30000,
			want: map[string]string{
				"| cold start":               "≥ 18.00 (a lower bound|✓ met",
				"| peak RSS (process alone)": "400.0 MiB vs ≥ 900.0 MiB|? undecided",
				"| idle RSS":                 "not measured",
				"| new connections/s":        "N = 1: 4000/s vs 3900/s, 1.03|N = 30,000: 3900/s, upstream-nft not measured|✓ met",
			},
		},
		{
			name: "the machine slowed between N = 1 and n: the direct path of each N, interleaved, takes it out",
			r: func() *Results {
				r := scaleResults(10000, 2, 30, false, 90<<20, 300<<20, 3600)
				r.DataPaths = append(r.DataPaths, DataPath{Proxy: NoProxy, N: 1, ConnPerSec: 5000},
					DataPath{Proxy: NoProxy, N: 10000, ConnPerSec: 4500})
				return r
			}(),
			n: 10000,
			want: map[string]string{
				"| kp's new connections/s": "3600/s vs 4000/s: 90.0%; each against the direct path of its N (4500/s, 5000/s): 100.0%|✓ met",
			},
		},
		{
			name: "ten interleaved rounds, kp below upstream's median but not in every round: equal within the noise",
			r: roundsAtN1([]float64{4200, 3800, 4100, 3700, 4300, 3900, 3600, 4000, 3950, 4050},
				[]float64{4000, 4100, 3900, 4000, 4100, 4200, 3800, 4150, 3900, 4050}),
			n: 10000,
			want: map[string]string{
				"| new connections/s": "N = 1: 3975/s vs 4025/s, 0.99 (10 rounds paired: 0.98, 95% interval 0.93–1.05)|? undecided",
			},
		},
		{
			name: "ten interleaved rounds, kp below upstream in nearly every round: a miss",
			r: roundsAtN1([]float64{3800, 3700, 3900, 3750, 3850, 3800, 3700, 4050, 3800, 3750},
				[]float64{4000, 4100, 3950, 4000, 4100, 4200, 3900, 4000, 4050, 3950}),
			n: 10000,
			want: map[string]string{
				"| new connections/s": "10 rounds paired: 0.94, 95% interval 0.90–0.99)|✗ missed",
			},
		},
	} {
		b := &strings.Builder{}
		writeScaleTargets(b, c.r, c.n)
		checkRows(t, c.name, b.String(), c.want)
	}
}

// roundsAtN1 is a run of kp and upstream-nft at N = 1 and 10,000 whose data
// path at N = 1 is interleaved rounds of the given rates.
func roundsAtN1(kp, up []float64) *Results {
	r := scaleResults(10000, 2, 30, false, 90<<20, 300<<20, 3900)
	r.DataPaths = slices.DeleteFunc(r.DataPaths, func(d DataPath) bool { return d.N == 1 })
	for i := range kp {
		r.DataPaths = append(r.DataPaths, DataPath{Proxy: KP, N: 1, ConnPerSec: kp[i]},
			DataPath{Proxy: UpstreamNFT, N: 1, ConnPerSec: up[i]})
	}
	return r
}

func TestPairedRatioIntervalHoldsTheMedianOfTheRatios(t *testing.T) {
	kp := []float64{10, 9, 12, 11, 8, 10, 13, 9, 10, 11}
	up := []float64{10, 10, 10, 10, 10, 10, 10, 10, 10, 10}
	med, lo, hi, ok := pairedRatio(kp, up)
	// Ratios sorted: 0.8 0.9 0.9 1.0 1.0 1.0 1.1 1.1 1.2 1.3; with 10
	// rounds the interval is the 2nd to the 9th (97.9 % coverage).
	if !ok || med != 1.0 || lo != 0.9 || hi != 1.2 {
		t.Errorf("pairedRatio = %v, %v–%v, %v; want 1.0, 0.9–1.2, true", med, lo, hi, ok)
	}
	if _, _, _, ok := pairedRatio(kp[:5], up[:5]); ok {
		t.Error("5 rounds gave an interval; none has 95 % coverage")
	}
	if _, lo, hi, ok := pairedRatio(kp[:6], up[:6]); !ok || lo != 0.8 || hi != 1.2 {
		t.Errorf("6 rounds: %v–%v, %v; want the extremes 0.8–1.2 (96.9 %% coverage)", lo, hi, ok)
	}
	if _, _, _, ok := pairedRatio(kp, up[:9]); ok {
		t.Error("unpaired rounds gave an interval")
	}
}
