package bench

import (
	"strings"
	"testing"
)

// scaleResults is a run of kp and upstream-nft at N = 1 and n, five rounds:
// kp's cold starts at n take kp seconds, upstream's up (nil: it ran into a
// 360 s limit and measured nothing else there); kpRate is kp's rate at n
// in each round, against upstream's 3800.
func scaleResults(n int, kp, up []float64, kpRSS, upRSS int64, kpRate float64) *Results {
	r := &Results{Run: Run{ID: "run", Commit: "c"}, Ns: []int{1, n}}
	one := []float64{0.2, 0.21, 0.19, 0.2, 0.2}
	coldStarts(r, KP, 1, one, 40<<20, 0)
	coldStarts(r, UpstreamNFT, 1, scaled(one, 7), 58<<20, 0)
	coldStarts(r, KP, n, kp, kpRSS, 0)
	changes(r, KP, n, 0.0040, 0.0042, 0.0038, 0.0040, 0.0041)
	for i := range kp {
		r.Idles = append(r.Idles, stamp(r.Run.ID, i+1, Idle{Proxy: KP, N: n, RSS: kpRSS - 10<<20})...)
	}
	addRates(r, KP, 1, 4000, 4040, 3960, 4000, 4000)
	addRates(r, UpstreamNFT, 1, 3900, 3939, 3861, 3900, 3900)
	addRates(r, KP, n, kpRate, kpRate*1.01, kpRate*0.99, kpRate, kpRate)
	if up == nil {
		timeout(r, UpstreamNFT, n, 360, 20000)
		return r
	}
	coldStarts(r, UpstreamNFT, n, up, upRSS, 300<<20)
	for i := range up {
		r.Idles = append(r.Idles, stamp(r.Run.ID, i+1, Idle{Proxy: UpstreamNFT, N: n, RSS: upRSS - 10<<20})...)
	}
	addRates(r, UpstreamNFT, n, 3800, 3838, 3762, 3800, 3800)
	return r
}

func TestScaleTargetsAreJudgedOnTheIntervalOfEachRatio(t *testing.T) {
	kp := []float64{2, 2.2, 1.8, 2.1, 1.9}
	for _, c := range []struct {
		name string
		r    *Results
		n    int
		want map[string]string // row's target prefix -> substrings its line must hold
	}{
		{
			name: "fast, small, and at upstream's rate",
			r:    scaleResults(10000, kp, scaled(kp, 15), 90<<20, 300<<20, 3900),
			n:    10000,
			want: map[string]string{
				"| cold start":               "kp 2.00 s, upstream-nft 30.00 s (medians); upstream / kp by round: 15.00|✓ met",
				"| one endpoint change":      "geometric mean 4.0 ms, 95% interval 3.8 ms–4.2 ms (5 changes)|✓ met",
				"| peak RSS (process alone)": "kp 90.0 MiB vs upstream-nft 300.0 MiB (medians); by round: 0.30|✓ met",
				"| idle RSS":                 "80.0 MiB vs 290.0 MiB (medians); by round: 0.28|✓ met",
				"| new connections/s":        "N = 1: 4000/s vs 3900/s (medians), by round 1.03|N = 10,000: 3900/s vs 3800/s (medians), by round 1.03|✓ met",
				"| kp's new connections/s":   "3900/s vs 4000/s (no direct path at both Ns): 0.97, 95% interval 0.96–0.99 (5 rounds)|✓ met",
			},
		},
		{
			name: "too big, and slower per connection at N in every round",
			r:    scaleResults(10000, kp, scaled(kp, 3.75), 126<<20, 277<<20, 3500),
			n:    10000,
			want: map[string]string{
				"| cold start":               "by round: 3.75|✗ missed",
				"| peak RSS (process alone)": "kp 126.0 MiB vs upstream-nft 277.0 MiB|✗ missed",
				"| new connections/s":        "N = 10,000: 3500/s vs 3800/s (medians), by round 0.92|✗ missed",
				"| kp's new connections/s":   "0.88|✗ missed",
			},
		},
		{
			name: "upstream ran out of time at 30,000: its rows are misses, not bounds",
			r:    scaleResults(30000, kp, nil, 400<<20, 900<<20, 3900),
			n:    30000,
			want: map[string]string{
				"| cold start":               "upstream-nft's cold start ran into its time limit (360.00 s; the kernel held 20000 of 30,000 Services)|✗ missed",
				"| peak RSS (process alone)": "✗ missed",
				"| idle RSS":                 "✗ missed",
				"| new connections/s":        "N = 1: 4000/s vs 3900/s|N = 30,000: upstream-nft's cold start ran into its time limit|✗ missed",
				"| one endpoint change":      "✓ met",
			},
		},
		{
			name: "the machine slowed between N = 1 and n: the direct path of each round takes it out",
			r: func() *Results {
				r := scaleResults(10000, kp, scaled(kp, 15), 90<<20, 300<<20, 3600)
				addRates(r, NoProxy, 1, 5000, 5050, 4950, 5000, 5000)
				addRates(r, NoProxy, 10000, 4500, 4545, 4455, 4500, 4500)
				return r
			}(),
			n: 10000,
			want: map[string]string{
				"| kp's new connections/s": "3600/s vs 4000/s, each against the direct path of its round (4500/s, 5000/s): 1.00, 95% interval|✓ met",
			},
		},
		{
			name: "one change of five took twice the others: the interval holds the limit, undecided",
			r: func() *Results {
				r := scaleResults(10000, kp, scaled(kp, 15), 90<<20, 300<<20, 3900)
				r.Incrementals = nil
				changes(r, KP, 10000, 0.004, 0.006, 0.003, 0.004, 0.004)
				return r
			}(),
			n:    10000,
			want: map[string]string{"| one endpoint change": "geometric mean 4.1 ms, 95% interval 3.0 ms–5.6 ms (5 changes)|? undecided"},
		},
		{
			name: "kp below upstream's rate in some rounds, above in others: undecided",
			r:    roundsAtN1([]float64{4200, 3800, 4100, 3700, 4300}, []float64{4000, 4100, 3900, 4000, 4100}),
			n:    10000,
			want: map[string]string{
				"| new connections/s": "N = 1: 4100/s vs 4000/s (medians), by round 1.00, 95% interval 0.92–1.09 (5 rounds)|? undecided",
			},
		},
		{
			name: "kp below upstream in every round: a miss",
			r:    roundsAtN1([]float64{3800, 3700, 3900, 3750, 3850}, []float64{4000, 4100, 3950, 4000, 4100}),
			n:    10000,
			want: map[string]string{"| new connections/s": "N = 1: 3800/s vs 4000/s (medians), by round 0.94, 95% interval 0.91–0.98 (5 rounds)|✗ missed"},
		},
	} {
		b := &strings.Builder{}
		writeScaleTargets(b, c.r, c.n)
		checkRows(t, c.name, b.String(), c.want)
	}
}

// roundsAtN1 is a run of kp and upstream-nft at N = 1 and 10,000 whose data
// path at N = 1 is these rounds.
func roundsAtN1(kp, up []float64) *Results {
	r := scaleResults(10000, []float64{2, 2, 2, 2, 2}, []float64{30, 30, 30, 30, 30}, 90<<20, 300<<20, 3900)
	var keep []DataPath
	for _, d := range r.DataPaths {
		if d.N != 1 {
			keep = append(keep, d)
		}
	}
	r.DataPaths = keep
	addRates(r, KP, 1, kp...)
	addRates(r, UpstreamNFT, 1, up...)
	return r
}
