package bench

import (
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestQuantileIntervalIsTheOrderStatisticsABinomialBounds(t *testing.T) {
	xs := make([]float64, 1000)
	for i := range xs {
		xs[i] = float64(i + 1)
	}
	// n q = 990, √(n q (1−q)) = 3.146: ranks 990 ∓ 6.17, the upper one
	// rounded up and one further.
	if lo, hi := quantileInterval(xs, 0.99, z95); lo != 983 || hi != 998 {
		t.Errorf("95 %% interval of the p99 of 1…1000: %v–%v, want 983–998", lo, hi)
	}
	if lo, hi := quantileInterval(xs[:100], 0.99, z95); lo != 97 || !math.IsInf(hi, 1) {
		t.Errorf("of 100 values the p99's upper bound is past the sample: got %v–%v, want 97–+Inf", lo, hi)
	}
	q := sampleQuantiles(append(slices.Clone(xs), math.Inf(1)))
	if q.P50 != 501 || q.P99 != 991 || q.P999 != 1000 || q.Max != beyond || q.Count != 1001 {
		t.Errorf("quantiles of 1…1000 and one unobserved change: %+v", q)
	}
	if iv := q.p99Interval(); iv.Mid != 991 || iv.Lo != 984 || iv.Hi != 999 || !iv.ok() {
		t.Errorf("p99 interval %+v", iv)
	}
	if got := sampleQuantiles(nil); got != (Quantiles{}) {
		t.Errorf("quantiles of nothing: %+v, want zeros (JSON has no NaN)", got)
	}
}

func TestP99RatioIsTheFarEndsOfTheWiderIntervals(t *testing.T) {
	a := Quantiles{Count: 1000, P99: 0.01, P99Lo2: 0.008, P99Hi2: 0.012}
	b := Quantiles{Count: 1000, P99: 1, P99Lo2: 0.5, P99Hi2: beyond}
	iv := p99Ratio(a, b)
	if iv.Mid != 0.01 || iv.Lo != 0 || math.Abs(iv.Hi-0.024) > 1e-12 {
		t.Errorf("ratio %+v, want 0.01 in 0–0.024 (b's upper bound beyond the timeout)", iv)
	}
	if v := decide(iv, atMostTarget, 1.0/20); v != unmeasured && v != undecided {
		// Lo = 0 is not a known value: no interval, nothing decided.
		t.Errorf("verdict %v", v)
	}
}

func TestHistogramQuantileInterpolatesWithinTheBucket(t *testing.T) {
	inf := math.Inf(1)
	before := []Bucket{{0, 0}, {0.25, 10}, {0.5, 10}, {inf, 10}}
	after := []Bucket{{0.5, 110}, {0.25, 100}, {0, 10}, {inf, 110}}
	d := histogramDelta(before, after)
	if want := []Bucket{{0, 10}, {0.25, 90}, {0.5, 100}, {inf, 100}}; !slices.Equal(d, want) {
		t.Fatalf("delta %v, want %v", d, want)
	}
	for _, c := range []struct{ q, want float64 }{
		{0.05, 0},                    // in the bucket at 0
		{0.5, 0.25 * (50 - 10) / 80}, // 0–0.25 holds ranks 10–90
		{0.99, 0.25 + 0.25*(99-90)/10},
	} {
		if got := histogramQuantile(d, c.q); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("q %v: %v, want %v", c.q, got, c.want)
		}
	}
	if got := histogramQuantile([]Bucket{{0.25, 90}, {inf, 100}}, 0.99); !math.IsInf(got, 1) {
		t.Errorf("a rank in the +Inf bucket: %v, want +Inf", got)
	}
	if q := histogramQuantiles(d); q.Count != 100 || !q.Interpolated || q.P99 != 0.475 {
		t.Errorf("summary %+v", q)
	}
}

func TestParseHistogramTakesTheIPv4Series(t *testing.T) {
	page := `# TYPE kubeproxy_network_programming_duration_seconds histogram
kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv6",le="0.25"} 7
kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="0.25"} 3
kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="+Inf"} 4
kubeproxy_network_programming_duration_seconds_sum{ip_family="IPv4"} 0.5
kubeproxy_network_programming_duration_seconds_bucket{le="1"} 5`
	got := parseHistogram(page, "kubeproxy_network_programming_duration_seconds")
	if want := []Bucket{{0.25, 3}, {math.Inf(1), 4}, {1, 5}}; !slices.Equal(got, want) {
		t.Errorf("buckets %v, want %v", got, want)
	}
}

func TestOpenLoopSendsOnScheduleWithoutWaitingForEarlierSends(t *testing.T) {
	const rate, d = 200.0, 500 * time.Millisecond
	for _, c := range []struct{ inFlight, want int }{{64, 64}, {128, 100}} {
		var mu sync.Mutex
		started := map[int]time.Duration{}
		release := make(chan struct{})
		begin := time.Now()
		done := make(chan time.Duration)
		go func() {
			done <- openLoop(rate, d, c.inFlight, func(k int) {
				mu.Lock()
				started[k] = time.Since(begin)
				mu.Unlock()
				<-release // no send returns until the test says so
			})
		}()
		// Every send the bound allows starts while none has returned: the
		// loop does not wait for one before the next (a closed loop would
		// start one).
		deadline := time.Now().Add(10 * time.Second)
		for {
			mu.Lock()
			n := len(started)
			mu.Unlock()
			if n >= c.want || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(200 * time.Millisecond) // one more would have started by now
		mu.Lock()
		if len(started) != c.want {
			t.Errorf("in flight %d: %d sends started before any returned, want %d", c.inFlight, len(started), c.want)
		}
		mu.Unlock()
		close(release)
		lag := <-done
		if len(started) != 100 {
			t.Fatalf("%d sends in %v at %v/s, want 100", len(started), d, rate)
		}
		for k, at := range started {
			if due := time.Duration(float64(k) / rate * float64(time.Second)); at < due {
				t.Errorf("send %d started at %v, before its time %v", k, at, due)
			}
		}
		if c.inFlight < 100 && lag < 100*time.Millisecond {
			t.Errorf("in flight %d: the ticks that waited for a sender show no lag (%v)", c.inFlight, lag)
		}
	}
}

func TestChurnTargetWalksEveryServiceButTheSamples(t *testing.T) {
	for _, n := range []int{100, 200, 10000} {
		seen := map[int]bool{}
		for k := 0; k < n; k++ {
			i := churnTarget(k, n)
			if slices.Contains(samples(n), i) {
				t.Fatalf("N=%d: change %d edits sample Service %d", n, k, i)
			}
			seen[i] = true
		}
		// A sample's turn goes to its neighbour: at most that many
		// Services are visited twice in one walk.
		if len(seen) < n-2*len(samples(n)) {
			t.Errorf("N=%d: %d Services in %d changes", n, len(seen), n)
		}
	}
}

func TestChurnTargetsAreJudgedOnTheirIntervals(t *testing.T) {
	r := &Results{Run: Run{ID: "run", Commit: "c"}, Ns: []int{10000}}
	coldStarts(r, KP, 10000, []float64{1, 1}, 80<<20, 0)
	coldStarts(r, UpstreamNFT, 10000, []float64{15, 15}, 250<<20, 0)
	coldStarts(r, UpstreamIPTables, 10000, []float64{20, 20}, 250<<20, 0)
	phase := func(p string, rate, p99, cpu float64, unseen int) {
		q := Quantiles{Count: 60000, P50: p99 / 3, P99: p99, P999: p99 * 2, Max: p99 * 3,
			P99Lo: p99 * 0.9, P99Hi: p99 * 1.1, P99Lo2: p99 * 0.85, P99Hi2: p99 * 1.15}
		win := []float64{cpu * 0.95, cpu, cpu * 1.05, cpu, cpu}
		r.Churns = append(r.Churns, stamp(r.Run.ID, 0, Churn{Proxy: p, N: 10000, Rate: rate, Changes: 60000, Unobserved: unseen,
			Timeout: 60, Latency: q, CPUPerChange: cpu, CPUWindows: win})...)
	}
	phase(KP, 200, 0.030, 0.0002, 0)
	phase(UpstreamNFT, 200, 1.0, 0.01, 0)
	phase(UpstreamIPTables, 200, 5.0, 0.0015, 3)
	var b strings.Builder
	writeChurnTargets(&b, r, 10000)
	rows := strings.Split(b.String(), "\n")
	for _, want := range []struct{ row, verdict string }{
		{"p99, API write to the kernel, ≤ 50.0 ms at 200 changes/s", "✓ met"},
		{"p99 ≤ 1/20 of upstream-nft's at 200", "✓ met"},
		{"CPU per change ≤ 1/10 of upstream-nft's", "✓ met"},
		// 0.13 of upstream-iptables's, and upstream lost 3 changes.
		{"CPU per change ≤ 1/10 of upstream-iptables's", "✗ missed"},
	} {
		i := slices.IndexFunc(rows, func(l string) bool { return strings.Contains(l, want.row) })
		if i < 0 || !strings.Contains(rows[i], want.verdict) {
			t.Errorf("row %q: want %s in\n%s", want.row, want.verdict, b.String())
		}
	}
	if !strings.Contains(b.String(), "3 of 60000 changes") {
		t.Errorf("the unobserved changes are not named:\n%s", b.String())
	}
}

func TestTheChurnRestartSetsEveryProxysMinSyncPeriod(t *testing.T) {
	for _, c := range []struct{ args, want []string }{
		{[]string{"proxy", "--min-sync-period", "100ms", "--sync-period", "1h"},
			[]string{"proxy", "--min-sync-period", "0s", "--sync-period", "1h", "--profiling"}},
		{[]string{"--proxy-mode", "nftables", "--iptables-min-sync-period", "100ms", "--profiling"},
			[]string{"--proxy-mode", "nftables", "--iptables-min-sync-period", "0s", "--profiling"}},
	} {
		if got := withMinSync(c.args, 0, "--profiling"); !slices.Equal(got, c.want) {
			t.Errorf("withMinSync(%q) = %q, want %q", c.args, got, c.want)
		}
	}
}

func TestCPURatioIsOfTheWindowsMeansNotTheirGeometricMeans(t *testing.T) {
	// A proxy that syncs every other window: its geometric mean would be 0.
	iv := ratioOfMeans([]float64{1, 1, 1, 1}, []float64{0, 4, 0, 4})
	// b's relative standard error² is (16/3)/(4·2²) = 1/3, with 3 degrees
	// of freedom: 0.5 ± 3.182 · 0.5 · √(1/3).
	half := 3.182 * 0.5 * math.Sqrt(1.0/3)
	if iv.Mid != 0.5 || math.Abs(iv.Hi-(0.5+half)) > 1e-9 || iv.Lo != math.SmallestNonzeroFloat64 || iv.Rounds != 4 {
		t.Errorf("ratio of means %+v, want 0.5, up to %.4f, from (nearly) 0", iv, 0.5+half)
	}
	if v := decide(iv, atMostTarget, 0.1); v != undecided {
		t.Errorf("an interval from 0 to %.2f against ≤ 0.1: %v, want undecided", iv.Hi, v)
	}
	if iv := ratioOfMeans([]float64{1, 1.1, 0.9}, []float64{10, 11, 9}); math.Abs(iv.Mid-0.1) > 1e-12 || !(iv.Lo < 0.1 && iv.Hi > 0.1) {
		t.Errorf("ratio of means %+v, want 0.1 inside its interval", iv)
	}
}

// An upstream that fell past the timeout bounds kp's p99 ratio from above
// (its p99 is at least the timeout): the row is met on that bound,
// undecided when kp's own p99 over the timeout does not meet it (upstream's
// could be longer still), and missed when kp lost changes itself. The CPU row keeps upstream's miss: a proxy that
// did not do the work has no CPU per change to compare with.
func TestAP99RatioAgainstAnUpstreamPastTheTimeoutIsJudgedOnItsBound(t *testing.T) {
	beyond := Quantiles{Count: 60000, P50: -1, P99: -1, P999: -1, Max: -1, P99Lo: -1, P99Hi: -1, P99Lo2: -1, P99Hi2: -1}
	for _, tt := range []struct {
		kpP99   float64
		kpLost  int
		verdict string
	}{
		{0.0716, 0, "✓ met"},    // at most 0.0716 × 1.15 / 60 s
		{4.0, 0, "? undecided"}, // at most 0.077: the bound does not decide it
		{0.0716, 5, "✗ missed"}, // kp lost changes itself
	} {
		r := &Results{Run: Run{ID: "run", Commit: "c"}, Ns: []int{10000}}
		q := Quantiles{Count: 60000, P50: tt.kpP99 / 3, P99: tt.kpP99, P999: tt.kpP99 * 2, Max: tt.kpP99 * 3,
			P99Lo: tt.kpP99 * 0.9, P99Hi: tt.kpP99 * 1.1, P99Lo2: tt.kpP99 * 0.85, P99Hi2: tt.kpP99 * 1.15}
		win := []float64{0.004, 0.004, 0.004}
		r.Churns = stamp(r.Run.ID, 0,
			Churn{Proxy: KP, N: 10000, Rate: 200, Changes: 60000, Unobserved: tt.kpLost, Timeout: 60, Latency: q, CPUPerChange: 0.004, CPUWindows: win},
			Churn{Proxy: UpstreamNFT, N: 10000, Rate: 200, Changes: 60000, Unobserved: 47000, Timeout: 60, Latency: beyond, CPUPerChange: 0.006, CPUWindows: win})
		var b strings.Builder
		writeChurnTargets(&b, r, 10000)
		rows := strings.Split(b.String(), "\n")
		i := slices.IndexFunc(rows, func(l string) bool { return strings.Contains(l, "p99 ≤ 1/20 of upstream-nft's at 200") })
		if i < 0 || !strings.Contains(rows[i], tt.verdict) || !strings.Contains(rows[i], "beyond the 60.00 s timeout") {
			t.Errorf("kp p99 %v, %d lost: want %s on the bound in\n%s", tt.kpP99, tt.kpLost, tt.verdict, b.String())
		}
		j := slices.IndexFunc(rows, func(l string) bool { return strings.Contains(l, "CPU per change ≤ 1/10 of upstream-nft's at 200") })
		if j < 0 || !strings.Contains(rows[j], "✗ missed") {
			t.Errorf("the CPU row against an upstream that fell behind: want a miss in\n%s", b.String())
		}
	}
}
