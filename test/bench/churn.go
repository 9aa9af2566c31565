package bench

import (
	"math"
	"slices"
	"sort"
	"strconv"
)

// Churn is one proxy's churn phase at one rate (issue 35): EndpointSlice
// changes at a steady open-loop rate, each replacing one endpoint of a
// Service with a new address as a rolling update does, plus one Service
// created a second (each deleted once it has lived the phase's timeout),
// for a fixed time. Every change is timed
// from the API write being sent to the first nf_tables event in the proxy's
// namespace that names its new endpoint address (the kernel holds it): seen
// from outside the proxy (churn_test.go, kernelWatch).
type Churn struct {
	Mark
	Proxy   string
	N       int
	Rate    float64 // EndpointSlice changes a second asked
	Seconds float64 // the phase's length
	// MinSyncPeriod is the proxy's --min-sync-period in the phase (seconds).
	MinSyncPeriod float64
	// Changes are the EndpointSlice changes the API server acknowledged;
	// WriteErrors the writes it refused (not timed).
	Changes, WriteErrors int
	// Unobserved: changes whose new endpoint no kernel event named within
	// Timeout seconds of their write; each counts in Latency as beyond the
	// timeout, and any of them fails the proxy's rows.
	Unobserved int
	Timeout    float64
	// Lag is the generator's largest delay behind its schedule (seconds):
	// a tick waits only for a free sender (churnInFlight), never for an
	// earlier change's write or sync.
	Lag float64
	// Services created during the phase (one a second, each deleted once
	// it has lived Timeout), and those whose first endpoint no event named
	// within Timeout.
	Services, ServicesUnobserved int
	// Overruns are receive-buffer overflows of the event socket (ENOBUFS):
	// events were lost, and the changes they named count as unobserved.
	Overruns int `json:",omitempty"`
	// Latency: API write sent to the first kernel event naming the change,
	// over every change (the unobserved beyond the timeout).
	Latency Quantiles
	// ServiceLatency: a Service's create sent to the first event naming
	// its first endpoint.
	ServiceLatency Quantiles
	// Programming is the proxy's own kubeproxy_network_programming_duration_seconds
	// over the phase: the growth of its buckets, quantiles interpolated
	// within a bucket (its buckets are 0, 0.25, 0.5, 1, 2, … s in both kp
	// and upstream, so below 250 ms it says little). ProgrammingCount is
	// the growth of its count.
	Programming      Quantiles
	ProgrammingCount float64
	// CPUSeconds is the proxy's user+system time over the phase, with its
	// reaped children (upstream's nft and iptables-restore runs).
	CPUSeconds float64
	// CPUPerChange is CPUSeconds / Changes; CPUWindows the same in each
	// tenth of the phase, for its interval (ratioOfMeans).
	CPUPerChange float64
	CPUWindows   []float64 `json:",omitempty"`
}

// Quantiles summarises one latency distribution in seconds. A negative
// value stands for "beyond the timeout" (an unobserved change at that
// rank): JSON has no infinity.
type Quantiles struct {
	Count          int
	P50, P99, P999 float64
	Max            float64
	// P99Lo–P99Hi is the distribution-free 95 % interval of the p99 (the
	// order statistics whose ranks a binomial bounds); P99Lo2–P99Hi2 the
	// 97.5 % one, of which two make a 95 % interval of a ratio of p99s.
	P99Lo, P99Hi   float64
	P99Lo2, P99Hi2 float64
	// Interpolated: from histogram buckets, without intervals.
	Interpolated bool `json:",omitempty"`
}

// beyond is how Quantiles stores +Inf.
const beyond = -1

// stored is v as Quantiles keeps it: +Inf as beyond, NaN (nothing
// measured) as 0, which the report prints as "–".
func stored(v float64) float64 {
	switch {
	case math.IsInf(v, 1):
		return beyond
	case math.IsNaN(v):
		return 0
	}
	return v
}

// loaded is stored's inverse: beyond → +Inf.
func loaded(v float64) float64 {
	if v < 0 {
		return math.Inf(1)
	}
	return v
}

// Normal quantiles of two-sided 95 % and 97.5 % intervals.
const (
	z95  = 1.959964
	z975 = 2.241403
)

// sampleQuantiles summarises xs (+Inf for a change never observed), with
// the order-statistic intervals of its p99.
func sampleQuantiles(xs []float64) Quantiles {
	q := Quantiles{Count: len(xs)}
	if len(xs) == 0 {
		return q
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	at := func(p float64) float64 { return stored(Quantile(s, p)) }
	q.P50, q.P99, q.P999, q.Max = at(0.5), at(0.99), at(0.999), stored(s[len(s)-1])
	lo, hi := quantileInterval(s, 0.99, z95)
	q.P99Lo, q.P99Hi = stored(lo), stored(hi)
	lo, hi = quantileInterval(s, 0.99, z975)
	q.P99Lo2, q.P99Hi2 = stored(lo), stored(hi)
	return q
}

// quantileInterval is the distribution-free interval of the q-quantile of
// sorted at the normal quantile z: the order statistics of ranks
// nq ∓ z·√(nq(1−q)) (the normal approximation of the binomial count of
// values below the quantile). Where a rank falls outside the sample the
// bound is unknown: 0 below, +Inf above.
func quantileInterval(sorted []float64, q, z float64) (lo, hi float64) {
	n := float64(len(sorted))
	sd := math.Sqrt(n * q * (1 - q))
	l := int(math.Floor(n*q - z*sd)) // 1-based rank
	u := int(math.Ceil(n*q+z*sd)) + 1
	lo, hi = 0, math.Inf(1)
	if l >= 1 {
		lo = sorted[l-1]
	}
	if u <= len(sorted) {
		hi = sorted[u-1]
	}
	return lo, hi
}

// Bucket is one cumulative bucket of a Prometheus histogram: Count
// observations at or below LE.
type Bucket struct {
	LE    float64
	Count float64
}

// histogramDelta is after's buckets less before's (a histogram scraped at
// the start and the end of a phase), matched by bound; before may be empty.
func histogramDelta(before, after []Bucket) []Bucket {
	prev := map[float64]float64{}
	for _, b := range before {
		prev[b.LE] = b.Count
	}
	out := make([]Bucket, 0, len(after))
	for _, b := range after {
		out = append(out, Bucket{b.LE, b.Count - prev[b.LE]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].LE < out[j].LE })
	return out
}

// histogramQuantile is the q-quantile of cumulative buckets as Prometheus's
// histogram_quantile computes it: linear within the bucket the rank falls
// in, from the bucket below's bound (0 for the first); a rank in the +Inf
// bucket is beyond the largest finite bound (+Inf). NaN when empty.
func histogramQuantile(buckets []Bucket, q float64) float64 {
	if len(buckets) == 0 {
		return math.NaN()
	}
	total := buckets[len(buckets)-1].Count
	if total <= 0 {
		return math.NaN()
	}
	rank := q * total
	lowerLE, lowerCount := 0.0, 0.0
	for _, b := range buckets {
		if b.Count >= rank && b.Count > lowerCount {
			if math.IsInf(b.LE, 1) {
				return math.Inf(1)
			}
			return lowerLE + (b.LE-lowerLE)*(rank-lowerCount)/(b.Count-lowerCount)
		}
		lowerLE, lowerCount = b.LE, b.Count
	}
	return math.Inf(1)
}

// histogramQuantiles summarises a histogram's buckets (interpolated).
func histogramQuantiles(buckets []Bucket) Quantiles {
	q := Quantiles{Interpolated: true}
	if len(buckets) > 0 {
		q.Count = int(buckets[len(buckets)-1].Count)
	}
	q.P50, q.P99, q.P999 = stored(histogramQuantile(buckets, 0.5)), stored(histogramQuantile(buckets, 0.99)),
		stored(histogramQuantile(buckets, 0.999))
	return q
}

// parseLE reads a bucket's le label value ("+Inf" included).
func parseLE(s string) (float64, error) { return strconv.ParseFloat(s, 64) }

// p99Interval is the p99 of q with its 95 % interval, as an Interval for
// decide (its Rounds the sample size).
func (q Quantiles) p99Interval() Interval {
	return Interval{Mid: loaded(q.P99), Lo: loaded(q.P99Lo), Hi: loaded(q.P99Hi), Rounds: q.Count}
}

// p99Ratio is the interval of a's p99 over b's: the ratio of their 97.5 %
// intervals' far ends, which holds the ratio whenever both intervals hold
// their p99 (at least 95 % of the time).
func p99Ratio(a, b Quantiles) Interval {
	return Interval{Mid: loaded(a.P99) / loaded(b.P99), Lo: loaded(a.P99Lo2) / loaded(b.P99Hi2),
		Hi: loaded(a.P99Hi2) / loaded(b.P99Lo2), Rounds: min(a.Count, b.Count)}
}

// p99RatioOrBound is p99Ratio, but where b fell so far behind that its
// p99 is beyond timeout even at the low end of its interval: b's p99 is
// then at least timeout, so a's over b's is at most a's (high end) over
// timeout, an interval from 0 to that bound, which decides a target of the
// form "at most" by itself. (p99Ratio would divide by an infinite p99.)
func p99RatioOrBound(a, b Quantiles, timeout float64) (iv Interval, bounded bool) {
	if b.P99Lo2 >= 0 || a.P99 < 0 || a.P99Hi2 < 0 || !(timeout > 0) {
		return p99Ratio(a, b), false
	}
	// Lo is the smallest positive number rather than 0 (an Interval's ends
	// are positive): decide then says met when Hi meets an "at most"
	// target, and undecided, never missed, when it does not.
	return Interval{Mid: a.P99 / timeout, Lo: math.SmallestNonzeroFloat64, Hi: a.P99Hi2 / timeout, Rounds: a.Count}, true
}

// ratioOfMeans is the interval of mean(a)/mean(b) where nothing pairs a
// value of a with one of b: the delta method's standard error of the
// ratio, R·√(s²a/(na·ā²) + s²b/(nb·b̄²)), with Welch's degrees of freedom.
// For CPU per change in windows of a phase: a proxy that syncs every few
// seconds has windows with a sync's CPU in them and windows with none, and
// a geometric mean (logInterval) of such lumpy values is dragged towards
// the empty ones, while the mean of the windows is the phase's own figure.
func ratioOfMeans(a, b []float64) Interval {
	iv := Interval{Mid: math.NaN(), Lo: math.NaN(), Hi: math.NaN(), Rounds: min(len(a), len(b))}
	if len(a) == 0 || len(b) == 0 {
		return iv
	}
	ma, va := meanVar(a)
	mb, vb := meanVar(b)
	if !(ma > 0 && mb > 0) {
		return iv
	}
	iv.Mid = ma / mb
	if len(a) < 2 || len(b) < 2 {
		return iv
	}
	ra, rb := va/(float64(len(a))*ma*ma), vb/(float64(len(b))*mb*mb) // squared relative standard errors
	se := iv.Mid * math.Sqrt(ra+rb)
	df := 1
	if ra+rb > 0 {
		df = int(math.Floor((ra + rb) * (ra + rb) / (ra*ra/float64(len(a)-1) + rb*rb/float64(len(b)-1))))
	}
	half := tQuantile975(max(df, 1)) * se
	iv.Lo, iv.Hi = iv.Mid-half, iv.Mid+half
	if iv.Lo <= 0 {
		iv.Lo = math.SmallestNonzeroFloat64 // the interval reaches 0: only its upper end can decide
	}
	return iv
}
