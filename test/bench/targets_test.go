package bench

import (
	"strings"
	"testing"
)

// The fixtures of the target tests: figures given round by round.

// coldStarts adds one finished cold start of proxy at n per round, its
// seconds given by round, peak RSS rss (process) and child.
func coldStarts(r *Results, proxy string, n int, secs []float64, rss, child int64) {
	for i, s := range secs {
		r.FullSyncs = append(r.FullSyncs, stamp(r.Run.ID, i+1,
			FullSync{Proxy: proxy, N: n, Seconds: s, PeakRSS: rss, ChildRSS: child, Elements: n})...)
	}
}

// timeout adds a cold start of proxy at n that ran into a limit of secs
// with held Services in the kernel.
func timeout(r *Results, proxy string, n int, secs float64, held int) {
	r.FullSyncs = append(r.FullSyncs, stamp(r.Run.ID, 1,
		FullSync{Proxy: proxy, N: n, Seconds: secs, Elements: held, Unfinished: true, PeakRSS: 300 << 20})...)
}

// rates adds a data-path window of proxy at n per round.
func addRates(r *Results, proxy string, n int, rates ...float64) {
	for i, x := range rates {
		r.DataPaths = append(r.DataPaths, stamp(r.Run.ID, i+1, DataPath{Proxy: proxy, N: n, ConnPerSec: x})...)
	}
}

// changes adds endpoint changes of proxy at n with these own sync times.
func changes(r *Results, proxy string, n int, own ...float64) {
	for _, x := range own {
		r.Incrementals = append(r.Incrementals, stamp(r.Run.ID, 0, Incremental{Proxy: proxy, N: n, Seconds: x + 0.05, SyncSeconds: x})...)
	}
}

func scaled(xs []float64, f float64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = x * f
	}
	return out
}

// iptResults is a run of kp-iptables and upstream iptables mode at N = 1 and
// 10,000, five rounds: kp-iptables's cold starts at 10,000 take kp
// seconds round by round, upstream's up (nil: it ran into a 360 s limit,
// and then measured nothing else there).
func iptResults(kp, up []float64, kpRSS, upRSS int64) *Results {
	r := &Results{Run: Run{ID: "run", Commit: "c"}, Ns: []int{1, 10000}}
	one := []float64{0.2, 0.21, 0.19, 0.2, 0.2}
	coldStarts(r, KPIPTables, 1, one, 30<<20, 0)
	coldStarts(r, UpstreamIPTables, 1, scaled(one, 3), 40<<20, 0)
	coldStarts(r, KPIPTables, 10000, kp, kpRSS-10<<20, 10<<20)
	changes(r, KPIPTables, 10000, 0.020, 0.021, 0.019, 0.020, 0.022)
	addRates(r, NoProxy, 1, 10000, 10100, 9900, 10000, 10000)
	addRates(r, NoProxy, 10000, 10000, 10100, 9900, 10000, 10000)
	addRates(r, KPIPTables, 1, 6000, 6060, 5940, 6000, 6000)
	addRates(r, KPIPTables, 10000, 5700, 5757, 5643, 5700, 5700)
	addRates(r, UpstreamIPTables, 1, 6500, 6565, 6435, 6500, 6500)
	if up == nil {
		timeout(r, UpstreamIPTables, 10000, 360, 4000)
		return r
	}
	coldStarts(r, UpstreamIPTables, 10000, up, upRSS-50<<20, 50<<20)
	changes(r, UpstreamIPTables, 10000, 0.5, 0.45, 0.55, 0.5, 0.52)
	addRates(r, UpstreamIPTables, 10000, 3000, 3030, 2970, 3000, 3000)
	return r
}

func TestIPTablesTargetsAreJudgedOnTheIntervalOfEachRatio(t *testing.T) {
	kp := []float64{1, 1.1, 0.9, 1.05, 0.95}
	for _, c := range []struct {
		name string
		r    *Results
		want map[string]string // row's target prefix -> substrings its line must hold
	}{
		{
			name: "upstream timed out: every row comparing with it is a miss, whatever the bound",
			r:    iptResults(kp, nil, 100<<20, 300<<20),
			want: map[string]string{
				"| cold start":         "upstream-iptables's cold start ran into its time limit (360.00 s; the kernel held 4000 of 10,000 Services): no measurement|✗ missed",
				"| one endpoint":       "ran into its time limit|✗ missed",
				"| kp-iptables's new":  "kp-iptables 5700/s vs 6000/s, each against the direct path of its round (10000/s, 10000/s): 0.95|✓ met",
				"| peak RSS (process ": "✗ missed",
			},
		},
		{
			name: "kp over 10× faster in every round, a tenth of the sync, smaller",
			r:    iptResults(kp, scaled(kp, 20), 100<<20, 300<<20),
			want: map[string]string{
				"| cold start":         "upstream / kp-iptables by round: 20.00, 95% interval 20.00–20.00 (5 rounds)|✓ met",
				"| one endpoint":       "kp-iptables 20.4 ms, upstream-iptables 502.9 ms; ratio 0.041, 95% interval 0.037–0.045 (5 and 5 changes, unpaired)|✓ met",
				"| peak RSS (process ": "kp-iptables 100.0 MiB vs upstream-iptables 300.0 MiB (medians); by round: 0.33|✓ met",
			},
		},
		{
			name: "upstream about 10× kp's, round by round both sides of it: undecided",
			r:    iptResults(kp, []float64{9, 12.1, 9.9, 10, 10.45}, 100<<20, 300<<20),
			want: map[string]string{"| cold start": "(5 rounds)|? undecided"},
		},
		{
			name: "upstream 6–7× kp's in every round: a miss",
			r:    iptResults(kp, []float64{6.5, 7.3, 6, 6.8, 6.2}, 400<<20, 300<<20),
			want: map[string]string{
				"| cold start":         "✗ missed",
				"| peak RSS (process ": "by round: 1.33|✗ missed",
			},
		},
	} {
		b := &strings.Builder{}
		writeIPTablesTargets(b, c.r, 10000, KPIPTables, UpstreamIPTables)
		checkRows(t, c.name, b.String(), c.want)
	}
}

// checkRows checks that the report's row starting with each prefix of want
// holds every "|"-separated substring want gives it.
func checkRows(t *testing.T, name, report string, want map[string]string) {
	t.Helper()
	for prefix, wants := range want {
		var line string
		for _, l := range strings.Split(report, "\n") {
			if strings.HasPrefix(l, prefix) {
				line = l
			}
		}
		if line == "" {
			t.Errorf("%s: no row starts with %q:\n%s", name, prefix, report)
			continue
		}
		for _, w := range strings.Split(wants, "|") {
			if !strings.Contains(line, w) {
				t.Errorf("%s: row %q lacks %q:\n%s", name, prefix, w, report)
			}
		}
	}
}

// issue7Results is a run of kp, upstream-nft and the nft -f floor of kp's
// ruleset at N = 1 and 10,000, five rounds; kp's cold starts at 10,000
// take kp seconds, the floor's loads floor.
func issue7Results(kp, floor []float64) *Results {
	r := scaleResults(10000, kp, scaled(kp, 12), 80<<20, 260<<20, 3900)
	coldStarts(r, UpstreamIPTables, 10000, scaled(kp, 100), 300<<20, 0)
	for i, s := range floor {
		r.Floors = append(r.Floors, stamp(r.Run.ID, i+1, Floor{N: 10000, Seconds: s})...)
	}
	return r
}

func TestIssue7TargetsJudgeTheFloorRoundByRound(t *testing.T) {
	kp := []float64{1.4, 1.6, 1.3, 1.5, 1.4}
	for _, c := range []struct {
		name string
		r    *Results
		want map[string]string
	}{
		{
			name: "kp under the floor's 1.5× in every round",
			r:    issue7Results(kp, scaled(kp, 1/0.75)),
			want: map[string]string{
				"| full sync within 1.5× of the nft -f floor":      "kp 1.40 s vs nft -f 1.87 s (medians); by round: 0.75|✓ met",
				"| cold start ≥ 10× faster than upstream nftables": "by round: 12.00|✓ met",
				"| peak RSS at most a third of upstream-nft's":     "by round: 0.31|✓ met",
			},
		},
		{
			// A floor measured once, at another time, cannot pair with
			// any round: no interval, no verdict.
			name: "a floor outside the rounds pairs with nothing",
			r: func() *Results {
				r := issue7Results(kp, nil)
				r.Floors = stamp(r.Run.ID, 0, Floor{N: 10000, Seconds: 1.9})
				return r
			}(),
			want: map[string]string{"| full sync within 1.5×": "(0 rounds: no interval)|not measured"},
		},
		{
			name: "kp 1.4–1.6× the floor, round by round: undecided",
			r:    issue7Results(kp, []float64{1, 1.1, 0.85, 1.05, 0.92}),
			want: map[string]string{"| full sync within 1.5×": "? undecided"},
		},
	} {
		b := &strings.Builder{}
		writeTargets(b, c.r, 10000)
		checkRows(t, c.name, b.String(), c.want)
	}
}

func TestAUserspaceColdStartThatTimedOutIsAMissNotAReport(t *testing.T) {
	r := scaleResults(30000, []float64{5, 5, 5, 5, 5}, nil, 300<<20, 900<<20, 3900)
	coldStarts(r, KPUserspace, 1, []float64{0.16, 0.17, 0.15, 0.16, 0.16}, 40<<20, 0)
	addRates(r, KPUserspace, 1, 2100, 2121, 2079, 2100, 2100)
	timeout(r, KPUserspace, 30000, 900, 0)
	b := &strings.Builder{}
	writeUserspaceTargets(b, r, 30000)
	checkRows(t, "kp-userspace at 30,000 ran into its limit", b.String(), map[string]string{
		"| cold start at N = 30,000 reported":                     "kp-userspace's cold start ran into its time limit (900.00 s; the kernel held 0 of 30,000 Services)|✗ missed",
		"| new connections per second at N = 1 at least 50%":      "2100/s vs 4000/s (medians); by round: 0.53|✓ met",
		"| new connections per second at N = 30,000 at least 50%": "✗ missed",
		"| one long TCP connection":                               "✗ missed",
	})
	r = scaleResults(1000, []float64{0.3, 0.3, 0.3, 0.3, 0.3}, nil, 40<<20, 80<<20, 3900)
	coldStarts(r, KPUserspace, 1000, []float64{0.27, 0.28, 0.26, 0.27, 0.27}, 47<<20, 0)
	b.Reset()
	writeUserspaceTargets(b, r, 1000)
	checkRows(t, "kp-userspace at 1,000 finished every cold start", b.String(), map[string]string{
		"| cold start at N = 1,000 reported": "270.0 ms (median of 5)|✓ met",
	})
}
