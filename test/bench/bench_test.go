package bench

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"encoding/xml"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/test/apiserver"
	"github.com/kpproxy/kp/test/netns"
)

func TestMain(m *testing.M) { os.Exit(netns.Main(m)) }

// Flags of the real run (make bench); without -bench.n TestBench skips.
var (
	flagNs      = flag.String("bench.n", "", "comma-separated Service counts to measure, e.g. 1,1000,10000 (empty: TestBench skips)")
	flagOut     = flag.String("bench.out", ".", "folder REPORT.md, bench.svg and results.json are written to")
	flagRounds  = flag.String("bench.rounds", "", "MIN-MAX rounds per N in place of the stopping rule's (\"\": 5-12, the rule of make bench; the report names a departure)")
	flagChanges = flag.Int("bench.changes", 100, "incremental endpoint changes per proxy and N")
	flagWindow  = flag.Duration("bench.window", 3*time.Second, "data-path measurement window")
	flagIdle    = flag.Duration("bench.idle", 5*time.Second, "idle window after each cold start")
	flagProxies = flag.String("bench.proxies", strings.Join(HostProxies, ","), "comma-separated proxies to measure, in this order, from "+strings.Join(Proxies, ", ")+" (the ipvs ones need IPVS: make bench-vm)")
	flagBig     = flag.Int("bench.big", 0, "from this N on, upstream gets -bench.big.changes changes and -bench.big.timeout (0: no limit)")
	flagBigChg  = flag.Int("bench.big.changes", 20, "upstream's incremental changes at N >= -bench.big")
	flagBigTime = flag.Duration("bench.big.timeout", 10*time.Minute, "upstream's cold-start time limit at N >= -bench.big")
	flagChgTime = flag.Duration("bench.change.timeout", time.Minute, "bound of the wait for one incremental change's sync")
	flagNFTOnly = flag.Int("bench.nft-only", 0, "from this N on, measure kp's nftables mode and upstream-nft alone (0: never)")
	flagKPOnly  = flag.Int("bench.kp-only", 0, "from this N on, measure kp's nftables mode alone (0: never)")
	// The churn phases (issue 35): at each N of -bench.churn.n, every proxy
	// of -bench.churn.proxies the run measures gets one phase per rate.
	flagChurnNs      = flag.String("bench.churn.n", "10000", "comma-separated Ns with churn phases (\"\": none)")
	flagChurnRates   = flag.String("bench.churn.rates", "50,200", "EndpointSlice changes a second, one churn phase per rate")
	flagChurnTime    = flag.Duration("bench.churn.duration", 5*time.Minute, "length of one churn phase")
	flagChurnTimeout = flag.Duration("bench.churn.timeout", time.Minute, "a churn change not in the kernel this long after its write is unobserved (its rows fail)")
	flagChurnMinSync = flag.Duration("bench.churn.min-sync-period", 0, "every proxy's --min-sync-period in its churn phases (it is restarted with it)")
	flagChurnProfile = flag.String("bench.churn.profile", "", "folder for a CPU profile of each proxy in the middle half of each churn phase (\"\": none)")
	flagChurnProxies = flag.String("bench.churn.proxies", strings.Join([]string{KP, UpstreamNFT, UpstreamIPTables}, ","), "proxies with churn phases (those the kernel-event watch sees: nftables or iptables-nft)")
	flagNotes        = flag.String("bench.notes", "", "extra note for the report (what was skipped and why)")
	flagRender       = flag.String("bench.render", "", "measure nothing: render the report again from this results.json")
	// Set by TestBenchInTheVM: the VM's runs (one per N with -bench.vm.seed)
	// are parts of the host's one run, at its commit.
	flagRunID     = flag.String("bench.run.id", "", "the id of the run this one is part of (\"\": a new run)")
	flagRunCommit = flag.String("bench.run.commit", "", "the commit of the run this one is part of (with -bench.run.id)")
	flagRunDirty  = flag.Bool("bench.run.dirty", false, "the tree of the run this one is part of had uncommitted changes (with -bench.run.id)")
	// Set by TestBenchInTheVM for the run it starts in the VM.
	flagVM   = flag.String("bench.vm", "", "the virtual machine this run is in, for the report (\"\": the host)")
	flagEmit = flag.Bool("bench.emit", false, "also print results.json to stdout after each N, between markers (the VM's way out)")
)

// config shapes one run of the pipeline.
type config struct {
	Ns      []int
	Proxies []string
	Changes int           // incremental changes per proxy and N (none at N = 1)
	Window  time.Duration // one data-path or bulk window
	Workers int           // data-path load generator's parallel connections
	Idle    time.Duration // the idle window after each cold start
	// SyncTimeout bounds one cold start: upstream iptables mode at 30,000
	// Services takes minutes on a busy 2-core machine.
	SyncTimeout time.Duration
	// From N = Big on, upstream's proxies (minutes per cold start there)
	// get BigChanges changes and BigTimeout (a cold start that runs into
	// it ends the proxy's rounds at that N); from NFTOnly on, only kp's
	// nftables mode and upstream's; from KPOnly on, only kp's nftables
	// mode runs. 0 turns any of them off.
	Big, BigChanges int
	BigTimeout      time.Duration
	NFTOnly, KPOnly int
	// From NoLegacy on, the iptables-legacy pair is left out (0: never).
	NoLegacy int
	// Rule decides the number of rounds at each N (defaultRule).
	Rule StopRule
	// ChangeTimeout bounds the wait for one incremental change's sync
	// (default 1 minute; upstream's ipvs mode under the VM's emulation
	// takes longer).
	ChangeTimeout time.Duration
	// Churn shapes the churn phases (issue 35).
	Churn churnConfig
	// Restart shapes the restart and take-over phases (issue 35, item 4).
	Restart restartConfig
	// PathNs are the Ns whose data-path rounds take the paths a user hits
	// too (userpath_test.go).
	PathNs []int
}

// measures reports whether proxy runs at n (NFTOnly, KPOnly).
func (c config) measures(proxy string, n int) bool {
	switch {
	case c.KPOnly > 0 && n >= c.KPOnly:
		return proxy == KP
	case c.NFTOnly > 0 && n >= c.NFTOnly:
		return proxy == KP || proxy == UpstreamNFT
	case c.NoLegacy > 0 && n >= c.NoLegacy:
		return !isIPTablesLegacy(proxy)
	}
	return true
}

// TestBench is `make bench`: the whole comparison, written to -bench.out.
func TestBench(t *testing.T) {
	if *flagRender != "" {
		rerender(t, *flagRender)
		return
	}
	if *flagNs == "" {
		t.Skip("benchmark: run with -bench.n (make bench)")
	}
	cfg := config{Changes: *flagChanges, Window: *flagWindow, Workers: 4, Idle: *flagIdle, SyncTimeout: 15 * time.Minute,
		Big: *flagBig, BigChanges: *flagBigChg, BigTimeout: *flagBigTime, NFTOnly: *flagNFTOnly, KPOnly: *flagKPOnly,
		NoLegacy: *flagNoLegacy, Rule: defaultRule, ChangeTimeout: *flagChgTime}
	if *flagRounds != "" {
		lo, hi, ok := strings.Cut(*flagRounds, "-")
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if !ok || err1 != nil || err2 != nil || a < 1 || b < a {
			t.Fatalf("-bench.rounds: %q is not MIN-MAX", *flagRounds)
		}
		cfg.Rule.MinRounds, cfg.Rule.MaxRounds = a, b
	}
	cfg.Churn = churnFlags(t)
	cfg.Restart = restartFlags(t)
	cfg.PathNs = pathFlags(t)
	for _, p := range strings.Split(*flagProxies, ",") {
		if p = strings.TrimSpace(p); !slices.Contains(Proxies, p) {
			t.Fatalf("-bench.proxies: %q is not a proxy; known: %s", p, strings.Join(Proxies, ", "))
		}
		cfg.Proxies = append(cfg.Proxies, p)
	}
	for _, s := range strings.Split(*flagNs, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			t.Fatalf("-bench.n: %q is not a Service count", s)
		}
		cfg.Ns = append(cfg.Ns, n)
	}
	load := watchLoad(t)
	// The report is rewritten after every N, so a run cut short still
	// leaves what it measured.
	write := func(res *Results) {
		if *flagVM == "" { // in a VM its own load says little: the host's is taken there
			res.Machine.Load = load.String()
		}
		res.Command = "make bench BENCH_N=" + *flagNs
		res.Machine.VM = *flagVM
		if *flagNotes != "" && !slices.Contains(res.Notes, *flagNotes) {
			res.Notes = append(res.Notes, *flagNotes)
		}
		if err := writeAll(*flagOut, res); err != nil {
			t.Fatal(err)
		}
		t.Logf("report written to %s", filepath.Join(*flagOut, "REPORT.md"))
		if *flagEmit {
			if err := emitResults(os.Stdout, res); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Once more when the run is complete: the writes after each round
	// came before Run.Complete was set, and the report would say the run
	// was cut short.
	write(run(t, cfg, write))
}

// serviceCounts parses flag name's value, a comma-separated list of
// Service counts ("" is none).
func serviceCounts(t *testing.T, name, value string) []int {
	var ns []int
	for _, s := range strings.Split(value, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("-%s: %q is not a Service count", name, s)
		}
		ns = append(ns, n)
	}
	return ns
}

// churnFlags reads the -bench.churn.* flags.
func churnFlags(t *testing.T) churnConfig {
	c := churnConfig{Duration: *flagChurnTime, Timeout: *flagChurnTimeout, MinSyncPeriod: *flagChurnMinSync, ProfileDir: *flagChurnProfile,
		Ns: serviceCounts(t, "bench.churn.n", *flagChurnNs)}
	for _, s := range strings.Split(*flagChurnRates, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		r, err := strconv.ParseFloat(s, 64)
		if err != nil || !(r > 0) {
			t.Fatalf("-bench.churn.rates: %q is not a rate", s)
		}
		c.Rates = append(c.Rates, r)
	}
	for _, p := range strings.Split(*flagChurnProxies, ",") {
		if p = strings.TrimSpace(p); !slices.Contains(Proxies, p) || isIPTablesLegacy(p) {
			t.Fatalf("-bench.churn.proxies: %q is not a proxy with churn phases (the iptables-legacy pair has none: "+
				"x_tables writes no nf_tables event to time a change by); known: %s", p, strings.Join(Proxies, ", "))
		}
		c.Proxies = append(c.Proxies, p)
	}
	return c
}

// rerender writes the report of an earlier run again, from its
// results.json, with -bench.notes added and its command set to -bench.n.
func rerender(t *testing.T, path string) {
	res := loadResults(t, path)
	if *flagNs != "" {
		res.Command = "make bench BENCH_N=" + *flagNs
	}
	if *flagNotes != "" && !slices.Contains(res.Notes, *flagNotes) {
		res.Notes = append(res.Notes, *flagNotes)
	}
	if err := writeAll(*flagOut, res); err != nil {
		t.Fatal(err)
	}
}

// loadResults reads an earlier run's results.json.
func loadResults(t *testing.T, path string) *Results {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var res Results
	if err := json.Unmarshal(raw, &res); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return &res
}

// TestBenchSmoke runs the benchmark's pipeline small (N = 1 and 100, every
// proxy, one of everything) and checks that the report and plot render. It times nothing against any expectation.
func TestBenchSmoke(t *testing.T) {
	netns.Require(t, "nft", "conntrack", "iptables-save", "iptables-nft-save", "iptables-legacy", "ip6tables-legacy")
	apiserver.Bin(t, apiserver.KubeProxy)
	// Every host proxy, kp-iptables too: kp has its iptables mode
	// (legacy/iptables), so a kp that refuses its flags fails the smoke
	// rather than leaving the proxy out.
	cfg := config{Ns: []int{1, 100}, Proxies: HostProxies, Changes: 3, Window: 300 * time.Millisecond, Workers: 2,
		Idle: 200 * time.Millisecond, SyncTimeout: 2 * time.Minute, Rule: StopRule{MinRounds: 1, MaxRounds: 1, HalfWidth: 0.1},
		// The churn path at a tiny size: 10 s at 20 changes a second.
		Churn: churnConfig{Ns: []int{100}, Rates: []float64{20}, Proxies: []string{KP, UpstreamNFT, UpstreamIPTables},
			Duration: 10 * time.Second, Timeout: 30 * time.Second},
		// Both phases for kp and upstream-nft (kp's take-over of it).
		Restart: restartConfig{Ns: []int{100}, Proxies: []string{KP, UpstreamNFT}},
		PathNs:  []int{100}}
	res := run(t, cfg, nil)
	if t.Failed() {
		return
	}
	for _, p := range cfg.Proxies {
		if got := res.fullSync(p, 100, func(f FullSync) float64 { return float64(f.Elements) }); len(got) != 1 || got[0] < 100 {
			t.Errorf("%s: full sync at N=100 saw %v Services in the kernel, want 100", p, got)
		}
		if got := res.incremental(p, 100, func(i Incremental) float64 { return float64(i.Events) }); len(got) != cfg.Changes {
			t.Errorf("%s: %d incremental changes measured, want %d", p, len(got), cfg.Changes)
		}
		if got := res.incremental(p, 100, func(i Incremental) float64 { return i.SyncSeconds }); slices.Min(append(got, 0)) < 0 ||
			(isKP(p) && slices.Max(append(got, 0)) <= 0) {
			t.Errorf("%s: sync times per change %v: the duration metric was not read", p, got)
		}
		if len(res.dataPath(p, 100)) != 1 {
			t.Errorf("%s: no data-path measurement at N=100", p)
		}
		if len(res.bulk(p, 100)) != 1 {
			t.Errorf("%s: no bulk measurement at N=100", p)
		}
		if got := res.fullSync(p, 100, func(f FullSync) float64 { return float64(f.FDs) }); len(got) != 1 || got[0] < 3 {
			t.Errorf("%s: open descriptors after the cold start %v, want one count of at least 3", p, got)
		}
	}
	checkChurnSmoke(t, cfg, res)
	checkRestartSmoke(t, cfg, res)
	checkUserPathSmoke(t, cfg, res)
	for _, p := range []string{KP, KPIPTables} {
		if got := res.floor(p, 100); slices.Contains(cfg.Proxies, p) && len(got) != 1 {
			t.Errorf("%s: %d kernel floors at N=100, want 1", p, len(got))
		}
	}
	dir := t.TempDir()
	if err := writeAll(dir, res); err != nil {
		t.Fatal(err)
	}
	report, _ := os.ReadFile(filepath.Join(dir, "REPORT.md"))
	want := []string{"## Full sync", "## Incremental", "## Churn", "## Targets (issue 35", "## Restart over a live table", "## Targets (issue 35, item 4", "## Data path", "## Bulk throughput", "## Kernel floor", "## Idle", "| 100 |", PlotFile}
	if len(res.bulk(NoProxy, 100)) != 1 {
		t.Errorf("no direct bulk measurement at N=100")
	}
	if slices.Contains(cfg.Proxies, KPUserspace) {
		want = append(want, "| kp-userspace |", "kp-userspace / kp", "## Targets (issue 16")
	}
	if slices.Contains(cfg.Proxies, KPIPTables) {
		want = append(want, "| kp-iptables |", "## Targets (issue 13", "iptables-nft-restore --noflush |")
	}
	want = append(want, legacySmokeWants(cfg)...)
	for _, want := range want {
		if !bytes.Contains(report, []byte(want)) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
	plot, _ := os.ReadFile(filepath.Join(dir, PlotFile))
	if err := xml.Unmarshal(plot, new(struct{ XMLName xml.Name })); err != nil {
		t.Errorf("plot is not well-formed SVG: %v", err)
	}
}

// run is the pipeline: for each N, grow the API server's population, then
// measure every proxy of the N in interleaved rounds (measureN). after, if
// set, sees the results after each round.
func run(t *testing.T, cfg config, after func(*Results)) *Results {
	res := &Results{Run: newRun(t, cfg.Rule), Endpoints: endpointsPer, Changes: cfg.Changes, Machine: machine(t)}
	res.Run.Budget, res.Run.Plan = cfg.plan()
	t.Logf("the stopping rule: %s", cfg.Rule)
	for _, line := range res.Run.Plan {
		t.Logf("plan: %s", line)
	}
	t.Logf("time budget of the run: %v (the rule's cap of rounds at the expected times; past the minimum, an N adds no round once its share is spent)",
		res.Run.Budget.Round(time.Minute))
	started := time.Now()
	c := newCluster(t)
	t.Logf("API server (etcd and kube-apiserver) ready in %v", time.Since(started).Round(time.Millisecond))
	for _, n := range cfg.Ns {
		took := c.grow(n)
		t.Logf("N=%d: API server populated in %v", n, took.Round(time.Millisecond))
		res.Ns = append(res.Ns, n)
		// The N's worlds live until its data path is measured.
		t.Run(fmt.Sprintf("N=%d", n), func(t *testing.T) {
			measureN(t, c, cfg, n, res, func() {
				// After each round, not only each N: a run cut short (the
				// VM's time limit) still leaves every round it finished.
				res.Run.Ended = time.Now()
				if after != nil {
					after(res)
				}
			})
		})
		res.Run.Ended = time.Now()
		if after != nil {
			after(res)
		}
	}
	res.Run.Ended, res.Run.Complete = time.Now(), true
	return res
}

// newRun draws the run's id and records the commit of the tree, its flags
// and its stopping rule. A run that is part of another (the VM's, started
// by TestBenchInTheVM) takes that one's id and commit.
func newRun(t *testing.T, rule StopRule) Run {
	run := Run{ID: *flagRunID, Commit: *flagRunCommit, Dirty: *flagRunDirty, Rule: rule, Started: time.Now()}
	if run.ID == "" {
		id := make([]byte, 6)
		if _, err := rand.Read(id); err != nil {
			t.Fatal(err)
		}
		run.ID = run.Started.UTC().Format("20060102T1504Z-") + hex.EncodeToString(id)
		head, err := exec.Command("git", "rev-parse", "HEAD").Output()
		if err != nil {
			t.Fatalf("the commit measured: git rev-parse HEAD: %v", err)
		}
		status, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output()
		if err != nil {
			t.Fatalf("the tree measured: git status: %v", err)
		}
		run.Commit, run.Dirty = strings.TrimSpace(string(head)), len(bytes.TrimSpace(status)) > 0
	}
	flag.VisitAll(func(f *flag.Flag) {
		if strings.HasPrefix(f.Name, "bench.") {
			run.Flags = append(run.Flags, "-"+f.Name+"="+f.Value.String())
		}
	})
	return run
}

// writeAll writes REPORT.md, the plot and the raw results into dir.
func writeAll(dir string, res *Results) error {
	var report, plot bytes.Buffer
	if err := WriteReport(&report, res); err != nil {
		return err
	}
	if err := WritePlot(&plot, res); err != nil {
		return err
	}
	raw, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{"REPORT.md": report.Bytes(), PlotFile: plot.Bytes(), "results.json": raw} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// machine describes this machine for the report.
func machine(t *testing.T) Machine {
	m := Machine{Cores: runtime.NumCPU(), Go: runtime.Version()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b := kbField("/proc/meminfo", "MemTotal:"); b > 0 {
		m.MemGB = float64(b) / (1 << 30)
	}
	if out, err := exec.Command(apiserver.Bin(t, apiserver.KubeProxy), "--version").Output(); err == nil {
		m.Upstream = strings.TrimSpace(string(out))
	}
	m.IPTables = iptablesCommand()
	return m
}

// iptablesCommand says which iptables `iptables` is here: upstream's
// iptables mode runs iptables-restore and iptables-save by those names, so
// the update-alternatives link decides its backend (Debian's default is
// iptables-nft), and kp-iptables is given the same with --iptables-backend.
func iptablesCommand() string {
	version, err := exec.Command("iptables", "--version").Output()
	if err != nil {
		return ""
	}
	s := strings.TrimSpace(string(version))
	if out, err := exec.Command("update-alternatives", "--query", "iptables").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if v, ok := strings.CutPrefix(line, "Value: "); ok {
				s += ", `iptables` → " + strings.TrimSpace(v) + " (update-alternatives)"
			}
		}
	}
	return s
}
