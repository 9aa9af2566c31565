// Package bench measures kp (its nftables, iptables and userspace modes) against
// upstream kube-proxy (nftables and iptables modes) side by side, in one run, against one real kube-apiserver,
// each proxy a real process in a network namespace of its own. `make bench`
// runs it (TestBench with -bench.n) and writes REPORT.md; `make test` runs
// only TestBenchSmoke, the same pipeline at N = 100, so the code cannot rot.
// Nothing here asserts a speed: benchmarks are not tests.
//
// This file holds the results and their statistics; report.go renders them.
// The harness that produces them is in the _test.go files.
package bench

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// Proxies under test, in report order, and the no-proxy reference of the
// data path.
const (
	KP               = "kp" // kp's nftables mode, its default
	UpstreamNFT      = "upstream-nft"
	KPIPTables       = "kp-iptables" // kp --proxy-mode iptables --iptables-backend nft
	UpstreamIPTables = "upstream-iptables"
	// KPIPTablesLegacy and UpstreamIPTablesLegacy are the two iptables
	// modes through iptables-legacy (x_tables) instead (legacy.go).
	KPIPTablesLegacy       = "kp-iptables-legacy" // kp --proxy-mode iptables --iptables-backend legacy
	UpstreamIPTablesLegacy = "upstream-iptables-legacy"
	// KPUserspace is kp --proxy-mode userspace (nftables redirects): no
	// upstream counterpart (upstream removed the mode); it is compared
	// with kp's nftables mode and with no proxy.
	KPUserspace = "kp-userspace"
	// KPIPVS is kp --proxy-mode ipvs and UpstreamIPVS upstream's ipvs
	// mode: measured only on a kernel with IPVS (the VM's, make bench-vm).
	KPIPVS       = "kp-ipvs"
	UpstreamIPVS = "upstream-ipvs"
	NoProxy      = "none (direct to pod)"
)

// Proxies lists every proxy the harness knows, in report order: each of
// kp's modes next to upstream's same mode.
var Proxies = []string{KP, UpstreamNFT, KPIPTables, UpstreamIPTables, KPIPTablesLegacy, UpstreamIPTablesLegacy, KPUserspace,
	KPIPVS, UpstreamIPVS}

// HostProxies are those measured by default (-bench.proxies): the ipvs
// modes need a kernel with IPVS, which this host's lacks.
var HostProxies = []string{KP, UpstreamNFT, KPIPTables, UpstreamIPTables, KPIPTablesLegacy, UpstreamIPTablesLegacy, KPUserspace}

// isKP says whether proxy is one of kp's modes: those are never cut short
// by the limits set for upstream at large N (-bench.big).
func isKP(proxy string) bool {
	return proxy == KP || proxy == KPIPTables || proxy == KPIPTablesLegacy || proxy == KPUserspace || proxy == KPIPVS
}

// isIPVS says whether proxy programs IPVS virtual servers.
func isIPVS(proxy string) bool { return proxy == KPIPVS || proxy == UpstreamIPVS }

// writesNFTables says whether every change of proxy is an nftables
// transaction nft monitor can see (the userspace mode keeps endpoints in
// its own memory: an endpoint change writes nothing).
func writesNFTables(proxy string) bool { return proxy == KP || proxy == UpstreamNFT }

// isIPTables says whether proxy writes through iptables-restore, whose
// transactions nft monitor does not report in the proxy's namespace.
func isIPTables(proxy string) bool {
	return proxy == KPIPTables || proxy == UpstreamIPTables || isIPTablesLegacy(proxy)
}

// comparison is one ratio the report shows: a kp mode over an upstream one.
type comparison struct{ kp, upstream string }

// comparisons are the ratios of the report, like for like first.
var comparisons = []comparison{{KP, UpstreamNFT}, {KPIPTables, UpstreamIPTables}, {KP, UpstreamIPTables},
	{KPIPTablesLegacy, UpstreamIPTablesLegacy}, {KPUserspace, KP}, {KPIPVS, UpstreamIPVS}}

func (c comparison) String() string { return c.kp + " / " + c.upstream }

// FullSync is one cold start: process start to every Service programmed.
type FullSync struct {
	Mark
	Proxy      string
	N          int
	Seconds    float64 // start to the sync that completed the set
	CPUSeconds float64 // user+system of the proxy and its reaped children
	PeakRSS    int64   // bytes, VmHWM of the proxy process
	ChildRSS   int64   // bytes, largest VmHWM seen of a child (nft, iptables-restore)
	Elements   int     // Services seen programmed in the kernel
	// FDs is the proxy process's open file descriptors at the end of the
	// cold start (the userspace mode holds a listener per service port).
	FDs int `json:",omitempty"`
	// Unfinished: the kernel did not hold every Service before the time
	// limit; Seconds is that limit (a lower bound), and no other measure
	// of this proxy at this N was taken.
	Unfinished bool `json:",omitempty"`
}

// Incremental is one endpoint change through the API server.
type Incremental struct {
	Mark
	Proxy   string
	N       int
	Seconds float64 // API write sent to the kernel's commit of the change
	Events  int     // objects in the transaction, as nft monitor lists them
	// SyncSeconds is the proxy's own time in syncs for the change (its
	// sync duration metric): from having the change to the kernel's
	// answer, without the API server and the watch.
	SyncSeconds float64
}

// Floor is one load of a kp mode's ruleset, as its listing tool prints it,
// into an empty namespace: `nft -f` for kp, iptables-nft-restore for
// kp-iptables.
type Floor struct {
	Mark
	// Proxy is the kp mode whose ruleset was loaded; "" is kp (runs from
	// before kp-iptables).
	Proxy string `json:",omitempty"`
	// NoFlush: loaded with iptables-nft-restore --noflush, as a proxy
	// that shares the tables with others must (both iptables modes do).
	NoFlush bool `json:",omitempty"`
	N       int
	Seconds float64
	// CPUSeconds is the loading process's user+system time (the kernel's
	// commit included); 0 in runs before it was recorded.
	CPUSeconds float64 `json:",omitempty"`
	Lines      int     // lines of the ruleset file
}

// proxy is the kp mode of f.
func (f Floor) proxy() string {
	if f.Proxy == "" {
		return KP
	}
	return f.Proxy
}

// DataPath is one timed window of the connection-rate load generator.
type DataPath struct {
	Mark
	Proxy      string
	N          int
	ConnPerSec float64
	Errors     int
}

// Bulk is one long TCP connection's throughput: the client sends as much
// as it can for the window to a sink in a pod, through the proxy's
// ClusterIP (or, for NoProxy, to the pod directly).
type Bulk struct {
	Mark
	Proxy   string
	N       int
	MBps    float64 // 10^6 bytes per second the sink received
	Bytes   int64
	Seconds float64
}

// Idle is a proxy's cost while nothing changes, after its full sync.
type Idle struct {
	Mark
	Proxy      string
	N          int
	RSS        int64   // bytes, VmRSS at the end of the window
	CPUSeconds float64 // over the window
	Window     float64 // seconds
}

// Machine describes where the run happened.
type Machine struct {
	Kernel, CPU, Go, Upstream string
	// IPTables is what the `iptables` command is here (its version and
	// the update-alternatives link): the backend upstream's iptables mode
	// writes through.
	IPTables string `json:",omitempty"`
	// VM describes the virtual machine the run was made in ("" on the
	// host): under software emulation only the ratios count.
	VM string `json:",omitempty"`
	// Load is how busy the machine running the proxies' host was during
	// the run (for a VM run, the host's): loadWatch's summary.
	Load  string `json:",omitempty"`
	Cores int
	MemGB float64
}

// Run identifies one run of the benchmark: one process measuring one
// commit's code. Every record carries the run's ID, and the report is
// rendered only from records of a single run (oneRun): figures measured at
// different times or commits are not comparable on this machine (its drift
// over an hour is as large as the differences judged), so merging runs is
// not offered.
type Run struct {
	ID     string // random, drawn when the run starts
	Commit string // git HEAD of the tree measured
	// Dirty: the tree had uncommitted changes; the figures are of no
	// commit.
	Dirty bool `json:",omitempty"`
	// Flags are every -bench.* flag of the run as name=value, set or
	// default, in name order.
	Flags []string
	// Rule is the stopping rule the run followed, fixed before it began.
	Rule StopRule
	// Budget is the run's time budget, computed before it began from the
	// rule and the expected times (Plan: by N and phase).
	Budget  time.Duration
	Plan    []string `json:",omitempty"`
	Started time.Time
	// Ended is when the results were last written: the end of the run
	// when Complete, else where it was cut short.
	Ended    time.Time
	Complete bool `json:",omitempty"`
}

// Mark says which run measured a record, and in which of its interleaved
// rounds.
type Mark struct {
	Run string
	// Round numbers the round of interleaved measurements the record
	// belongs to, from 1; records of one round and N were measured
	// minutes apart at most, so a ratio pairs them (pairByRound). 0: the
	// record was measured outside the rounds (an endpoint change).
	Round int `json:",omitempty"`
}

// mark is the Mark of a record.
func (m *Mark) mark() *Mark { return m }

type record interface{ mark() *Mark }

// stamp marks xs as measured by run id in round.
func stamp[T any, P interface {
	*T
	record
}](id string, round int, xs ...T) []T {
	for i := range xs {
		m := P(&xs[i]).mark()
		m.Run, m.Round = id, round
	}
	return xs
}

// Results is everything one run measured.
type Results struct {
	Run       Run
	Machine   Machine
	Ns        []int
	Endpoints int // per Service
	Changes   int // incremental changes per proxy and N
	Command   string
	Notes     []string // what was skipped and why, and other caveats
	// Stops say how the rounds of each N and phase ended (StopRule).
	Stops        []Stop `json:",omitempty"`
	FullSyncs    []FullSync
	Incrementals []Incremental
	Floors       []Floor
	DataPaths    []DataPath
	Bulks        []Bulk `json:",omitempty"`
	Idles        []Idle
	// Churns are the churn phases (issue 35), one per proxy, N and rate.
	Churns []Churn `json:",omitempty"`
	// Restarts and TakeOvers are issue 35 item 4's phases (restart.go).
	Restarts  []Restart  `json:",omitempty"`
	TakeOvers []TakeOver `json:",omitempty"`
	// UserPaths are the windows of the paths a user hits (issue 35):
	// many Services, UDP, a NodePort (userpath.go).
	UserPaths []UserPath `json:",omitempty"`
}

// oneRun says why r cannot be rendered, if it cannot: it names no run or
// commit, or one of its records was measured by another run.
func (r *Results) oneRun() error {
	if r.Run.ID == "" || r.Run.Commit == "" {
		return errors.New("results name no run id or commit (results.json from before one run per report, or assembled by hand): " +
			"only a single run's results are rendered; run make bench")
	}
	var errs []error
	check := func(kind, proxy string, n int, m Mark) {
		if m.Run != r.Run.ID && len(errs) < 5 {
			errs = append(errs, fmt.Errorf("%s of %s at N = %d is of run %q, not of this run %q (commit %s)",
				kind, proxy, n, m.Run, r.Run.ID, r.Run.Commit))
		}
	}
	for _, x := range r.FullSyncs {
		check("cold start", x.Proxy, x.N, x.Mark)
	}
	for _, x := range r.Incrementals {
		check("endpoint change", x.Proxy, x.N, x.Mark)
	}
	for _, x := range r.Floors {
		check("floor", x.proxy(), x.N, x.Mark)
	}
	for _, x := range r.DataPaths {
		check("data-path window", x.Proxy, x.N, x.Mark)
	}
	for _, x := range r.Bulks {
		check("bulk window", x.Proxy, x.N, x.Mark)
	}
	for _, x := range r.Idles {
		check("idle window", x.Proxy, x.N, x.Mark)
	}
	for _, x := range r.Churns {
		check("churn phase", x.Proxy, x.N, x.Mark)
	}
	r.restartMarks(check)
	for _, x := range r.UserPaths {
		check(x.Path+" window", x.Proxy, x.N, x.Mark)
	}
	if len(errs) > 0 {
		return fmt.Errorf("results mix runs; a report shows one run: %w", errors.Join(errs...))
	}
	return nil
}

// Median of xs (NaN when empty).
func Median(xs []float64) float64 { return Quantile(xs, 0.5) }

// Quantile is the nearest-rank q-quantile of xs (NaN when empty): the
// smallest value at least a fraction q of the values are at or below.
func Quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if q == 0.5 && len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// Tail is the tail of xs named for what it is: their nearest-rank p99
// when there are at least 100 (of fewer, the nearest-rank p99 is their
// maximum), else their maximum; name is "p99 of 150" or "max of 50".
func Tail(xs []float64) (v float64, name string) {
	switch {
	case len(xs) == 0:
		return math.NaN(), ""
	case len(xs) >= 100:
		return Quantile(xs, 0.99), fmt.Sprintf("p99 of %d", len(xs))
	}
	return slices.Max(xs), fmt.Sprintf("max of %d", len(xs))
}

// pick gathers one value from every record of proxy at n.
func pick[T any](records []T, match func(T) bool, value func(T) float64) []float64 {
	var out []float64
	for _, r := range records {
		if match(r) {
			out = append(out, value(r))
		}
	}
	return out
}

// fullSync picks the finished cold starts of proxy at n.
func (r *Results) fullSync(proxy string, n int, value func(FullSync) float64) []float64 {
	return pick(r.FullSyncs, func(f FullSync) bool { return f.Proxy == proxy && f.N == n && !f.Unfinished }, value)
}

// proxies is Proxies without those of which r holds no cold start, in
// report order.
func (r *Results) proxies() []string {
	var out []string
	for _, p := range Proxies {
		if slices.ContainsFunc(r.FullSyncs, func(f FullSync) bool { return f.Proxy == p }) {
			out = append(out, p)
		}
	}
	return out
}

// has says whether r holds a cold start of proxy at n, finished or not.
func (r *Results) has(proxy string, n int) bool {
	return slices.ContainsFunc(r.FullSyncs, func(f FullSync) bool { return f.Proxy == proxy && f.N == n })
}

// unfinished is the longest time limit a cold start of proxy at n ran
// into, 0 when none did.
func (r *Results) unfinished(proxy string, n int) float64 {
	return slices.Max(append(pick(r.FullSyncs, func(f FullSync) bool { return f.Proxy == proxy && f.N == n && f.Unfinished },
		func(f FullSync) float64 { return f.Seconds }), 0))
}

func (r *Results) incremental(proxy string, n int, value func(Incremental) float64) []float64 {
	return pick(r.Incrementals, func(f Incremental) bool { return f.Proxy == proxy && f.N == n }, value)
}

func (r *Results) dataPath(proxy string, n int) []float64 {
	return pick(r.DataPaths, func(d DataPath) bool { return d.Proxy == proxy && d.N == n },
		func(d DataPath) float64 { return d.ConnPerSec })
}

func (r *Results) bulk(proxy string, n int) []float64 {
	return pick(r.Bulks, func(d Bulk) bool { return d.Proxy == proxy && d.N == n }, func(d Bulk) float64 { return d.MBps })
}

func (r *Results) idle(proxy string, n int, value func(Idle) float64) []float64 {
	return pick(r.Idles, func(d Idle) bool { return d.Proxy == proxy && d.N == n }, value)
}

func (r *Results) floor(proxy string, n int) []float64 { return r.floorOf(proxy, n, false) }

// floorOf is floor, of the loads with --noflush when noFlush is set.
func (r *Results) floorOf(proxy string, n int, noFlush bool) []float64 {
	return pick(r.Floors, func(f Floor) bool { return f.proxy() == proxy && f.N == n && f.NoFlush == noFlush },
		func(f Floor) float64 { return f.Seconds })
}

// sortedNs is the distinct Ns measured, ascending.
func (r *Results) sortedNs() []int {
	ns := slices.Clone(r.Ns)
	slices.SortFunc(ns, cmp.Compare)
	return slices.Compact(ns)
}

// monitorMaxN is the largest N at which the size of each change is read
// from nft monitor: past it, nft monitor (which re-reads the ruleset to
// print what changed) falls behind by seconds and misses its subscription.
// A change's size does not depend on N.
const monitorMaxN = 1000
