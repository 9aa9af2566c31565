package bench

import (
	"encoding/json"
	"io"
	"math"
	"os"
	"strings"
	"testing"
)

func TestQuantileIsNearestRankAndMedianAveragesTheMiddlePair(t *testing.T) {
	hundred := make([]float64, 100)
	for i := range hundred {
		hundred[99-i] = float64(i + 1) // unsorted on purpose
	}
	for _, c := range []struct {
		name string
		xs   []float64
		q    float64
		want float64
	}{
		{"median of odd count", []float64{3, 1, 2}, 0.5, 2},
		{"median of even count", []float64{4, 1, 3, 2}, 0.5, 2.5},
		{"p99 of 1…100", hundred, 0.99, 99},
		{"p99 of three", []float64{1, 2, 3}, 0.99, 3},
		{"max", []float64{5, 7}, 1, 7},
	} {
		if got := Quantile(c.xs, c.q); got != c.want {
			t.Errorf("%s: Quantile(%v) = %v, want %v", c.name, c.q, got, c.want)
		}
	}
	if !math.IsNaN(Median(nil)) {
		t.Error("median of nothing is not NaN")
	}
}

func TestCountsPrintWithThousandsSeparators(t *testing.T) {
	for n, want := range map[int]string{1: "1", 100: "100", 1000: "1,000", 30000: "30,000", 1234567: "1,234,567"} {
		if got := fmtN(n); got != want {
			t.Errorf("fmtN(%d) = %q, want %q", n, got, want)
		}
	}
}

// oneRunOf is a run of kp and upstream-nft at N = 1,000, every record
// stamped with the run's id.
func oneRunOf(id, commit string) *Results {
	r := &Results{Run: Run{ID: id, Commit: commit}, Ns: []int{1000}}
	for round := 1; round <= 5; round++ {
		r.FullSyncs = append(r.FullSyncs, stamp(id, round, FullSync{Proxy: KP, N: 1000, Seconds: 0.3},
			FullSync{Proxy: UpstreamNFT, N: 1000, Seconds: 0.9})...)
		r.Floors = append(r.Floors, stamp(id, round, Floor{N: 1000, Seconds: 0.2})...)
		r.DataPaths = append(r.DataPaths, stamp(id, round, DataPath{Proxy: KP, N: 1000, ConnPerSec: 8000},
			DataPath{Proxy: NoProxy, N: 1000, ConnPerSec: 10000})...)
	}
	return r
}

func TestTheReportRefusesResultsNotAllOfOneRun(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(r *Results)
		want   string // in the error; "" renders
	}{
		{"one run renders", func(*Results) {}, ""},
		{"a direct path of another run (the merge of issue 35)", func(r *Results) {
			r.DataPaths[1].Run = "20261125T0100Z-other"
		}, `data-path window of none (direct to pod) at N = 1000 is of run "20261125T0100Z-other"`},
		{"a cold start of another commit's run", func(r *Results) {
			r.FullSyncs = append(r.FullSyncs, stamp("20261124T2108Z-5d2b054", 1, FullSync{Proxy: KPIPTables, N: 1000, Seconds: 2.5})...)
		}, "cold start of kp-iptables at N = 1000 is of run"},
		{"a record of no run (results.json from before run ids)", func(r *Results) { r.Floors[0].Run = "" }, "floor of kp"},
		{"results naming no commit", func(r *Results) { r.Run.Commit = "" }, "no run id or commit"},
		{"results naming no run", func(r *Results) { r.Run.ID = "" }, "no run id or commit"},
	} {
		r := oneRunOf("20261127T1500Z-a1", "a3816f3")
		c.change(r)
		var b strings.Builder
		err := WriteReport(&b, r)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: WriteReport = %v, want an error naming %q", c.name, err, c.want)
		case c.want != "" && b.Len() > 0:
			t.Errorf("%s: refused, yet wrote %d bytes", c.name, b.Len())
		}
	}
}

// The committed results.json merged runs at several commits and carries no
// run ids: it is not rendered again.
func TestTheCommittedMergedResultsAreNotRendered(t *testing.T) {
	raw, err := os.ReadFile("results.json")
	if err != nil {
		t.Skip(err)
	}
	var r Results
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatal(err)
	}
	if r.Run.ID != "" {
		t.Skip("results.json is of one run")
	}
	if err := WriteReport(io.Discard, &r); err == nil {
		t.Error("the merged results.json rendered")
	}
}

// From -bench.nft-only on only kp and upstream-nft run, from -bench.kp-only
// on only kp.
func TestConfigMeasuresFewerProxiesAtLargeN(t *testing.T) {
	c := config{NFTOnly: 30000, KPOnly: 100000}
	for _, tt := range []struct {
		proxy string
		n     int
		want  bool
	}{
		{KPIPTables, 10000, true}, {KPIPTables, 30000, false}, {UpstreamNFT, 30000, true},
		{UpstreamNFT, 100000, false}, {KP, 100000, true}, {KPUserspace, 1, true},
	} {
		if got := c.measures(tt.proxy, tt.n); got != tt.want {
			t.Errorf("measures(%s, %d) = %v, want %v", tt.proxy, tt.n, got, tt.want)
		}
	}
}

// The report's ratio columns pair the figures of each round: kp and
// upstream slowed together in round 3, and the ratio of their medians
// (1 s / 40 s) is not what any round showed.
func TestTheReportsRatioColumnsPairTheRounds(t *testing.T) {
	r := &Results{Run: Run{ID: "run", Commit: "c", Rule: defaultRule, Plan: []string{"N = 1,000: …"}}, Ns: []int{1000},
		Stops: []Stop{{N: 1000, Phase: "cold starts", Rounds: 5, Why: stopBudget, Widest: 0.2}}}
	coldStarts(r, KP, 1000, []float64{1, 1, 4}, 40<<20, 0)
	coldStarts(r, UpstreamNFT, 1000, []float64{10, 40, 40}, 80<<20, 0)
	addRates(r, KP, 1000, 100, 200, 400)
	addRates(r, UpstreamNFT, 1000, 100, 100, 800)
	addRates(r, NoProxy, 1000, 200, 200, 200)
	var b strings.Builder
	if err := WriteReport(&b, r); err != nil {
		t.Fatal(err)
	}
	report := b.String()
	// Round ratios 0.1, 0.025, 0.1: geometric mean 0.063; rates 1, 2, ½: 1.00.
	checkRows(t, "paired columns", report, map[string]string{
		"| 1,000 | 1.00 s | 40.00 s | 0.063 |": "| 3 |",
		"| 1,000 | 200/s | 200/s | 100/s |":    "| 3 |",
		"| 1,000 | 1.00 | 1.00 |":              "",
		"- **N = 1,000, cold starts: 5 rounds": "rounds stopped by the budget, not by the width of the intervals",
		"| Commit | c |":                       "",
	})
}

// The tail of fewer than 100 changes is their maximum, and called so: the
// nearest-rank p99 of 50 values is the largest of them.
func TestTheTailOfFewerThan100ChangesIsCalledTheirMax(t *testing.T) {
	upTo := func(n int) []float64 {
		xs := make([]float64, n)
		for i := range xs {
			xs[i] = float64(n - i) // unsorted on purpose
		}
		return xs
	}
	for _, c := range []struct {
		xs   []float64
		want float64
		name string
	}{
		{upTo(50), 50, "max of 50"},
		{upTo(99), 99, "max of 99"},
		{upTo(100), 99, "p99 of 100"},
		{upTo(1000), 990, "p99 of 1000"},
	} {
		if v, name := Tail(c.xs); v != c.want || name != c.name {
			t.Errorf("Tail of 1…%d = %v, %q; want %v, %q", len(c.xs), v, name, c.want, c.name)
		}
	}
	if v, name := Tail(nil); !math.IsNaN(v) || name != "" {
		t.Errorf("Tail of nothing = %v, %q", v, name)
	}
}
