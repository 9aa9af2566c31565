package bench

import (
	"fmt"
	"maps"
	"slices"
)

// A run measures in rounds (the harness's rounds_test.go): in round r,
// every proxy of an N and every reference (no proxy, the kernel floors) is
// measured once, one after the other in a rotating order, so figures of
// one round were taken minutes apart at most. Ratios are taken round by
// round, here.

// byRound is a figure per round (from 1).
type byRound map[int]float64

// roundsOf picks, from the records that match, value by round; records
// measured outside the rounds (Round 0) are left out.
func roundsOf[T any, P interface {
	*T
	record
}](recs []T, match func(T) bool, value func(T) float64) byRound {
	out := byRound{}
	for i := range recs {
		if m := P(&recs[i]).mark(); m.Round > 0 && match(recs[i]) {
			out[m.Round] = value(recs[i])
		}
	}
	return out
}

// values are the figures in round order.
func (b byRound) values() []float64 {
	out := make([]float64, 0, len(b))
	for _, r := range slices.Sorted(maps.Keys(b)) {
		out = append(out, b[r])
	}
	return out
}

// paired are the figures of a and b of the rounds both have, in round
// order: a[i] and b[i] are of one round.
func paired(a, b byRound) (xs, ys []float64) {
	for _, r := range slices.Sorted(maps.Keys(a)) {
		if y, ok := b[r]; ok {
			xs, ys = append(xs, a[r]), append(ys, y)
		}
	}
	return xs, ys
}

// ratio is the interval of a/b, paired by round.
func ratio(a, b byRound) Interval { return pairedInterval(paired(a, b)) }

// over is each round's a/b, for the rounds both have.
func over(a, b byRound) byRound {
	out := byRound{}
	for r, x := range a {
		if y, ok := b[r]; ok {
			out[r] = x / y
		}
	}
	return out
}

// coldStarts are proxy's finished cold starts at n by round.
func (r *Results) coldStarts(proxy string, n int, value func(FullSync) float64) byRound {
	return roundsOf(r.FullSyncs, func(f FullSync) bool { return f.Proxy == proxy && f.N == n && !f.Unfinished }, value)
}

// timedOut says why a row involving proxy at n cannot be judged: one of
// its cold starts ran into its time limit, or ended with nothing
// programmed ("" when neither). Such a row is a miss: it must be able to
// fail (issue 35: a timeout reported as a cold start passed).
func (r *Results) timedOut(proxy string, n int) string {
	for _, f := range r.FullSyncs {
		if f.Proxy != proxy || f.N != n {
			continue
		}
		switch {
		case f.Unfinished:
			return fmt.Sprintf("%s's cold start ran into its time limit (%s; the kernel held %d of %s Services): no measurement",
				proxy, fmtSeconds(f.Seconds), f.Elements, fmtN(n))
		case f.Elements == 0 && n > 0:
			return fmt.Sprintf("%s's cold start programmed no Service: no measurement", proxy)
		}
	}
	return ""
}

// floors are the loads of reference ref (floorNFT, floorIPT,
// floorIPTNoFlush) at n by round.
func (r *Results) floors(ref string, n int) byRound {
	proxy, noFlush := KP, false
	switch ref {
	case floorIPT:
		proxy = KPIPTables
	case floorIPTNoFlush:
		proxy, noFlush = KPIPTables, true
	}
	return roundsOf(r.Floors, func(f Floor) bool { return f.proxy() == proxy && f.N == n && f.NoFlush == noFlush },
		func(f Floor) float64 { return f.Seconds })
}

// rates are proxy's (or NoProxy's) new connections per second at n by
// round.
func (r *Results) rates(proxy string, n int) byRound {
	return roundsOf(r.DataPaths, func(d DataPath) bool { return d.Proxy == proxy && d.N == n },
		func(d DataPath) float64 { return d.ConnPerSec })
}

// bulks are proxy's (or NoProxy's) bulk throughput at n by round.
func (r *Results) bulks(proxy string, n int) byRound {
	return roundsOf(r.Bulks, func(d Bulk) bool { return d.Proxy == proxy && d.N == n }, func(d Bulk) float64 { return d.MBps })
}

// idles are proxy's idle figures at n by round.
func (r *Results) idles(proxy string, n int, value func(Idle) float64) byRound {
	return roundsOf(r.Idles, func(i Idle) bool { return i.Proxy == proxy && i.N == n }, value)
}

// ownSyncs are proxy's own sync times of its endpoint changes at n (not in
// rounds: one proxy's changes are made in its turn).
func (r *Results) ownSyncs(proxy string, n int) []float64 {
	return r.incremental(proxy, n, func(i Incremental) float64 { return i.SyncSeconds })
}

// rateVsN1 is proxy's new-connection rate at n as a share of its rate at
// N = 1, each taken round by round against the direct path (no proxy) of
// its own round: the Ns run one after the other, minutes apart, and what
// drifts on the machine meanwhile moves a round's windows alike (kp at 1,
// 10,000 and 100,000 moved ±10 % in one run, with no trend in N); the
// direct path, which crosses no rules at all, moves with the drift alone.
// The two Ns' rounds do not pair: Welch's interval. Without the direct
// path at both Ns, the raw rates are compared, and desc says so.
func (r *Results) rateVsN1(proxy string, n int) (iv Interval, desc string) {
	at, at1 := r.rates(proxy, n), r.rates(proxy, 1)
	d, d1 := r.rates(NoProxy, n), r.rates(NoProxy, 1)
	desc = fmt.Sprintf("%s vs %s", fmtRate(Median(at.values())), fmtRate(Median(at1.values())))
	if len(d) > 0 && len(d1) > 0 {
		iv = unpairedInterval(over(at, d).values(), over(at1, d1).values())
		return iv, desc + fmt.Sprintf(", each against the direct path of its round (%s, %s): %s",
			fmtRate(Median(d.values())), fmtRate(Median(d1.values())), iv)
	}
	iv = unpairedInterval(at.values(), at1.values())
	return iv, desc + fmt.Sprintf(" (no direct path at both Ns): %s", iv)
}
