package bench

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
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

// A run merged into an earlier one replaces only the proxies and Ns it
// measured: kp alone from 30,000 on (-bench.kp-only) leaves upstream's
// earlier record at 30,000, which an earlier merge by proxy × N dropped.
func TestMergeReplacesOnlyWhatTheRunMeasured(t *testing.T) {
	base := &Results{Ns: []int{10000, 30000}, FullSyncs: []FullSync{
		{Proxy: KP, N: 10000, Seconds: 5}, {Proxy: UpstreamNFT, N: 10000, Seconds: 50},
		{Proxy: KP, N: 30000, Seconds: 20}, {Proxy: UpstreamNFT, N: 30000, Seconds: 360, Unfinished: true},
	}}
	path := writeResults(t, base)
	run := &Results{Ns: []int{10000, 30000, 100000}, FullSyncs: []FullSync{
		{Proxy: KP, N: 10000, Seconds: 4}, {Proxy: UpstreamNFT, N: 10000, Seconds: 52},
		{Proxy: KP, N: 30000, Seconds: 16}, {Proxy: KP, N: 100000, Seconds: 53},
	}}
	got := map[string]float64{}
	for _, f := range merged(t, path, run).FullSyncs {
		got[fmt.Sprintf("%s@%d", f.Proxy, f.N)] = f.Seconds
	}
	want := map[string]float64{
		KP + "@10000": 4, UpstreamNFT + "@10000": 52, KP + "@30000": 16, UpstreamNFT + "@30000": 360, KP + "@100000": 53,
	}
	if !maps.Equal(got, want) {
		t.Errorf("merged full syncs %v, want %v", got, want)
	}
}

// writeResults writes r as an earlier run's results.json and returns its
// path.
func writeResults(t *testing.T, r *Results) string {
	t.Helper()
	raw, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "results.json")
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// The direct path of an N the run measured is the run's (its windows were
// interleaved with the run's proxies'); at other Ns the earlier one stays.
func TestMergeTakesTheRunsDirectPathWhereItHasOne(t *testing.T) {
	base := &Results{Ns: []int{1, 10000}, FullSyncs: []FullSync{{Proxy: KPIPTables, N: 1}, {Proxy: KPIPTables, N: 10000}},
		DataPaths: []DataPath{{Proxy: NoProxy, N: 1, ConnPerSec: 3000}, {Proxy: NoProxy, N: 10000, ConnPerSec: 3100},
			{Proxy: KPIPTables, N: 1, ConnPerSec: 2000}}}
	path := writeResults(t, base)
	run := &Results{Ns: []int{1}, FullSyncs: []FullSync{{Proxy: KP, N: 1}},
		DataPaths: []DataPath{{Proxy: NoProxy, N: 1, ConnPerSec: 9000}, {Proxy: KP, N: 1, ConnPerSec: 8000}}}
	got := map[string]float64{}
	for _, d := range merged(t, path, run).DataPaths {
		got[fmt.Sprintf("%s@%d", d.Proxy, d.N)] += d.ConnPerSec
	}
	want := map[string]float64{NoProxy + "@1": 9000, NoProxy + "@10000": 3100, KPIPTables + "@1": 2000, KP + "@1": 8000}
	if !maps.Equal(got, want) {
		t.Errorf("merged data paths %v, want %v", got, want)
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
