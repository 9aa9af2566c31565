package bench

import (
	"strings"
	"testing"
)

// iptResults is a run of kp-iptables and upstream iptables mode at N = 1 and
// 10,000: upstream's cold start at 10,000 either took upSeconds or, when
// upUnfinished, ran into that time limit (and then measured nothing else).
func iptResults(kpSeconds, upSeconds float64, upUnfinished bool, kpRSS, upRSS int64) *Results {
	r := &Results{Ns: []int{1, 10000}}
	r.FullSyncs = []FullSync{
		{Proxy: KPIPTables, N: 1, Seconds: 0.2, PeakRSS: 30 << 20},
		{Proxy: UpstreamIPTables, N: 1, Seconds: 0.6, PeakRSS: 40 << 20},
		{Proxy: KPIPTables, N: 10000, Seconds: kpSeconds, PeakRSS: kpRSS - 10<<20, ChildRSS: 10 << 20},
		{Proxy: UpstreamIPTables, N: 10000, Seconds: upSeconds, PeakRSS: upRSS - 50<<20, ChildRSS: 50 << 20, Unfinished: upUnfinished},
	}
	r.Incrementals = []Incremental{{Proxy: KPIPTables, N: 10000, SyncSeconds: 0.02}}
	r.DataPaths = []DataPath{
		{Proxy: KPIPTables, N: 1, ConnPerSec: 6000}, {Proxy: KPIPTables, N: 10000, ConnPerSec: 5700},
		{Proxy: UpstreamIPTables, N: 1, ConnPerSec: 6500},
	}
	if !upUnfinished {
		r.Incrementals = append(r.Incrementals, Incremental{Proxy: UpstreamIPTables, N: 10000, SyncSeconds: 0.5})
		r.DataPaths = append(r.DataPaths, DataPath{Proxy: UpstreamIPTables, N: 10000, ConnPerSec: 3000})
	}
	return r
}

func TestIPTablesTargetsJudgeAnUnfinishedUpstreamByItsLowerBound(t *testing.T) {
	for _, c := range []struct {
		name string
		r    *Results
		want map[string]string // row's target prefix -> substrings its line must hold
	}{
		{
			name: "upstream ran out of time, and its bound already shows 10×",
			r:    iptResults(12, 360, true, 100<<20, 300<<20),
			want: map[string]string{
				"| cold start":         "kp-iptables 12.00 s; upstream-iptables > 360.00 s (did not finish within the cold-start time limit): upstream / kp-iptables ≥ 30.00|✓ met",
				"| one endpoint":       "kp-iptables 20.0 ms, upstream-iptables –|did not finish|not measured",
				"| new connections/s":  "kp-iptables 5700/s vs 6000/s: 95.0%; upstream-iptables – vs 6500/s|✓ met",
				"| peak RSS (process ": "kp-iptables 100.0 MiB vs upstream-iptables ≥ 300.0 MiB: 0.33|✓ met",
			},
		},
		{
			name: "upstream ran out of time, but its bound is under 10× and under kp's peak",
			r:    iptResults(60, 360, true, 400<<20, 300<<20),
			want: map[string]string{
				"| cold start":         "≥ 6.00|? undecided",
				"| peak RSS (process ": "≥ 300.0 MiB: 1.33|? undecided",
			},
		},
		{
			name: "both finished, kp fast enough",
			r:    iptResults(1, 20, false, 100<<20, 300<<20),
			want: map[string]string{
				"| cold start":        "upstream / kp-iptables = 20.00|✓ met",
				"| one endpoint":      "kp-iptables 20.0 ms, upstream-iptables 500.0 ms: 0.040|✓ met",
				"| new connections/s": "upstream-iptables 3000/s vs 6500/s: 46.2%|✓ met",
			},
		},
		{
			name: "both finished, kp too slow and too big",
			r:    iptResults(3, 20, false, 400<<20, 300<<20),
			want: map[string]string{
				"| cold start":         "= 6.67|✗ missed",
				"| peak RSS (process ": "400.0 MiB vs upstream-iptables 300.0 MiB: 1.33|✗ missed",
			},
		},
	} {
		b := &strings.Builder{}
		writeIPTablesTargets(b, c.r, 10000)
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
		for _, w := range strings.Split(wants, "|") {
			if !strings.Contains(line, w) {
				t.Errorf("%s: row %q lacks %q:\n%s", name, prefix, w, report)
			}
		}
	}
}
