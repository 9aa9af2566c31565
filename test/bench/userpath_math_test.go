package bench

import (
	"math"
	"slices"
	"strings"
	"testing"
)

func TestChooseServicesIsSeededDistinctAndInRange(t *testing.T) {
	a := chooseServices(42, 100000, 100)
	if len(a) != 100 {
		t.Fatalf("drew %d Services, want 100", len(a))
	}
	s := slices.Clone(a)
	slices.Sort(s)
	if len(slices.Compact(s)) != 100 || s[0] < 0 || s[99] >= 100000 {
		t.Errorf("draw not 100 distinct Services in 0…99999: %v", s)
	}
	if !slices.Equal(a, chooseServices(42, 100000, 100)) {
		t.Errorf("the same seed drew other Services")
	}
	if slices.Equal(a, chooseServices(43, 100000, 100)) {
		t.Errorf("another seed drew the same Services")
	}
	// Not the first 100, nor clustered: a fair draw over 100,000 has its
	// median near 50,000.
	if m := s[50]; m < 30000 || m > 70000 {
		t.Errorf("median of the draw %d: not spread over the range", m)
	}
	if got := chooseServices(42, 7, 100); !slices.Equal(got, []int{0, 1, 2, 3, 4, 5, 6}) {
		t.Errorf("at N = 7: %v, want every Service", got)
	}
	if got := chooseServices(42, 100, 100); len(got) != 100 || got[99] != 99 {
		t.Errorf("at N = 100: want every Service in order, got %v", got)
	}
}

// Every Service is as likely to be drawn: over many seeds, each of 10
// Services is drawn about half the time when 5 are.
func TestChooseServicesIsUniform(t *testing.T) {
	counts := make([]int, 10)
	const draws = 20000
	for seed := uint64(0); seed < draws; seed++ {
		for _, i := range chooseServices(seed, 10, 5) {
			counts[i]++
		}
	}
	for i, c := range counts {
		if math.Abs(float64(c)/draws-0.5) > 0.02 {
			t.Errorf("Service %d drawn in %.3f of the draws, want 0.5", i, float64(c)/draws)
		}
	}
}

func TestPathSeedIsFixedPerRun(t *testing.T) {
	if pathSeed("run-a") != pathSeed("run-a") || pathSeed("run-a") == pathSeed("run-b") {
		t.Errorf("seed not a function of the run id")
	}
}

func TestPercentilesAreNearestRank(t *testing.T) {
	xs := make([]float64, 200)
	for i := range xs {
		xs[len(xs)-1-i] = float64(i + 1) // 200 … 1, unsorted
	}
	if p50, p99 := percentiles(xs); p50 != 100 || p99 != 198 {
		t.Errorf("1…200: p50 %v p99 %v, want 100 and 198", p50, p99)
	}
	if p50, p99 := percentiles([]float64{3, 1, 2}); p50 != 2 || p99 != 3 {
		t.Errorf("1, 2, 3: p50 %v p99 %v, want 2 and 3", p50, p99)
	}
	if p50, p99 := percentiles([]float64{5}); p50 != 5 || p99 != 5 {
		t.Errorf("one value: p50 %v p99 %v", p50, p99)
	}
	if p50, _ := percentiles(nil); !math.IsNaN(p50) {
		t.Errorf("no values: p50 %v, want NaN", p50)
	}
}

// userPathResults is kp and upstream-nft at N = 100 over five rounds, kp's
// rates f times upstream's and its latencies 1/f times; kpFails makes
// every kp attempt fail.
func userPathResults(f float64, kpFails bool) *Results {
	r := &Results{Run: Run{ID: "run", Commit: "c"}, Ns: []int{100}}
	coldStarts(r, KP, 100, []float64{1, 1, 1, 1, 1}, 10<<20, 0)
	coldStarts(r, UpstreamNFT, 100, []float64{2, 2, 2, 2, 2}, 20<<20, 0)
	wobble := []float64{1, 1.02, 0.98, 1.01, 0.99}
	other := []float64{1.03, 0.97, 1, 0.98, 1.02} // kp's, so the ratios vary round by round
	for i, w := range wobble {
		g := f * other[i]
		for _, path := range userPaths {
			up := UserPath{Path: path, Proxy: UpstreamNFT, N: 100, PerSec: 1000 * w, P50: 0.001 * w, P99: 0.004 * w, Count: 300}
			kp := UserPath{Path: path, Proxy: KP, N: 100, PerSec: 1000 * g, P50: 0.001 / g, P99: 0.004 / g, Count: 300}
			if kpFails {
				kp = UserPath{Path: path, Proxy: KP, N: 100, Errors: 40}
			}
			r.UserPaths = append(r.UserPaths, stamp(r.Run.ID, i+1, up, kp)...)
		}
	}
	return r
}

func TestUserPathTargetsAreJudgedOnThePairedRatio(t *testing.T) {
	for _, tc := range []struct {
		name    string
		f       float64
		kpFails bool
		want    string
	}{
		{"kp 20% better meets every row", 1.2, false, "✓ met"},
		{"kp 20% worse misses every row", 1 / 1.2, false, "✗ missed"},
		{"kp equal is undecided", 1, false, "? undecided"},
		{"kp failing every attempt misses", 1, true, "✗ missed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			writeUserPathTargets(&b, userPathResults(tc.f, tc.kpFails), 100)
			rows := 0
			for _, l := range strings.Split(b.String(), "\n") {
				if !strings.HasPrefix(l, "| kp: ") {
					continue
				}
				rows++
				if !strings.Contains(l, tc.want) {
					t.Errorf("row not %s:\n%s", tc.want, l)
				}
			}
			if rows != 5 {
				t.Errorf("%d rows, want 5 (three rates, two latencies):\n%s", rows, b.String())
			}
		})
	}
}

func TestUserPathsRenderInTheReport(t *testing.T) {
	var b strings.Builder
	r := userPathResults(1.2, false)
	writeUserPaths(&b, r)
	for _, want := range []string{"## Data path a user hits", pathTitle(pathUDP) + ": per second", pathTitle(pathServices) +
		": connect latency p99", "| 100 | – | 1200/s | 1000/s | 1.20 | 5 | 0 |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
	if err := r.oneRun(); err != nil {
		t.Errorf("one run: %v", err)
	}
	r.UserPaths[0].Run = "other"
	if err := r.oneRun(); err == nil || !strings.Contains(err.Error(), "services window") {
		t.Errorf("a window of another run not refused: %v", err)
	}
}
