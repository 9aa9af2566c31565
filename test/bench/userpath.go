package bench

import (
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
)

// The data path a user hits besides one ClusterIP (issue 35): connections
// spread over many Services, UDP request/response, and a NodePort reached
// from off the node. Each is measured in the data path's rounds (the
// harness's userpath_test.go), for every proxy that left its rules and for
// the direct path; userpath_report.go renders them.

// Paths of a UserPath record.
const (
	// pathServices: new TCP connections from the client, each to the next
	// of up to pathServiceCount Services drawn for the N (chooseServices),
	// every one pointed at the world's pods; connect latency per connection.
	pathServices = "services"
	// pathUDP: request/response datagrams through Service udp's ClusterIP,
	// each request from a new socket (a new flow, as a resolver's random
	// source port makes).
	pathUDP = "udp"
	// pathNodePort: new TCP connections from the client, a namespace
	// linked to the node as another machine is, to the node's address at
	// Service nodeport's NodePort.
	pathNodePort = "nodeport"
)

// userPaths are the paths in report order.
var userPaths = []string{pathServices, pathUDP, pathNodePort}

// pathServiceCount is how many Services pathServices spreads over.
const pathServiceCount = 100

// UserPath is one timed window of one path (pathServices, pathUDP,
// pathNodePort) through a proxy's rules, or direct (NoProxy).
type UserPath struct {
	Mark
	Path  string
	Proxy string
	N     int
	// PerSec is what completed per second: connections (connect, read
	// the greeting, reset) or UDP request/response exchanges.
	PerSec float64
	// P50 and P99 are nearest-rank percentiles of the window, in seconds:
	// of a TCP connection, connect() start to established; of a UDP
	// exchange, request sent to reply read.
	P50, P99 float64
	Count    int // completed in the window
	Errors   int // failed in the window
	// Services is how many Services the window's connections were spread
	// over (pathServices), Reached how many of them answered at least
	// once, Seed the seed they were drawn with (the run's, pathSeed).
	Services int    `json:",omitempty"`
	Reached  int    `json:",omitempty"`
	Seed     uint64 `json:",omitempty"`
}

// pathSeed is the seed of a run's choice of Services: its id hashed, so
// the choice is fixed for the run, differs between runs, and can be drawn
// again from results.json.
func pathSeed(runID string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(runID))
	return h.Sum64()
}

// chooseServices draws k of Services 0…n-1 with seed (every one when
// n <= k), in draw order; the same seed and n draw the same Services.
func chooseServices(seed uint64, n, k int) []int {
	if n <= k {
		all := make([]int, n)
		for i := range all {
			all[i] = i
		}
		return all
	}
	// A partial Fisher–Yates over a map of the swapped slots: k steps,
	// not n, at 100,000 Services.
	rng := rand.New(rand.NewPCG(seed, uint64(n)))
	swapped := map[int]int{}
	at := func(i int) int {
		if v, ok := swapped[i]; ok {
			return v
		}
		return i
	}
	out := make([]int, k)
	for i := 0; i < k; i++ {
		j := i + rng.IntN(n-i)
		out[i] = at(j)
		swapped[j] = at(i)
	}
	return out
}

// percentiles are the nearest-rank p50 and p99 of xs (NaN when empty).
func percentiles(xs []float64) (p50, p99 float64) {
	s := slices.Clone(xs)
	slices.Sort(s)
	return nearestRank(s, 0.5), nearestRank(s, 0.99)
}

// nearestRank is the q-quantile of sorted s by nearest rank: the smallest
// value at least a fraction q of the values are at or below.
func nearestRank(s []float64, q float64) float64 {
	if len(s) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// userPathsOf are proxy's (or NoProxy's) figures of path at n by round.
func (r *Results) userPathsOf(path, proxy string, n int, value func(UserPath) float64) byRound {
	return roundsOf(r.UserPaths, func(u UserPath) bool { return u.Path == path && u.Proxy == proxy && u.N == n }, value)
}

// pathErrors sums the failures and the completions of proxy's windows of
// path at n.
func (r *Results) pathErrors(path, proxy string, n int) (errs, count int) {
	for _, u := range r.UserPaths {
		if u.Path == path && u.Proxy == proxy && u.N == n {
			errs, count = errs+u.Errors, count+u.Count
		}
	}
	return errs, count
}

func perSec(u UserPath) float64 { return u.PerSec }
func p50Of(u UserPath) float64  { return u.P50 }
func p99Of(u UserPath) float64  { return u.P99 }
