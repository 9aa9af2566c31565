package bench

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/test/apiserver"
	"github.com/kpproxy/kp/test/netns"
	"github.com/kpproxy/kp/test/vm"
)

// The benchmark of the ipvs modes runs on the VM's kernel (test/vm): the
// host's has no IPVS. The host builds this package's test binary, kp and
// the echo server, boots the VM and runs TestBench there with -bench.emit;
// the results come back on the command's output (the VM's root is the
// host's, read-only) and the report is written here.
var (
	flagVMN       = flag.String("bench.vm.n", "", "Service counts to measure in the VM, e.g. 1000,10000 (empty: TestBenchInTheVM skips; make bench-vm)")
	flagVMProxies = flag.String("bench.vm.proxies", KPIPVS+","+UpstreamIPVS, "proxies TestBenchInTheVM measures in the VM")
	flagVMArgs    = flag.String("bench.vm.args", "", "more TestBench flags for the run in the VM, space-separated (e.g. -bench.changes=5)")
	flagVMOut     = flag.String("bench.vm.out", "vm", "folder the VM run's REPORT.md, bench.svg and results.json are written to")
	flagVMTimeout = flag.Duration("bench.vm.timeout", 3*time.Hour, "bound of the whole VM run (boot, API server, every N)")
	flagVMMemory  = flag.Int("bench.vm.memory", 8192, "the VM's memory, MiB: the API server, etcd and the proxies at 10,000 Services")
	flagVMSeed    = flag.Bool("bench.vm.seed", false, "populate each N's API server on the host (an etcd seed, seed_test.go) and boot the VM once per N on a copy: emulated population is the slow part")
	flagVMSmoke   = flag.Bool("bench.vm.smoke", false, "run TestBenchSmokeInTheVM: the ipvs proxies through the pipeline in the VM at N = 1 and 100 (minutes)")
)

// vmCPUs is the VM's vCPUs, as the host's cores.
const vmCPUs = 2

// resultsMarker starts the line that carries results.json (compact) out of
// the VM.
const resultsMarker = "KP-BENCH-RESULTS "

// emitResults prints res as one marked line, in one write.
func emitResults(w io.Writer, res *Results) error {
	raw, err := json.Marshal(res)
	if err != nil {
		return err
	}
	_, err = w.Write(append(append([]byte("\n"+resultsMarker), raw...), '\n'))
	return err
}

// lastResults reads the last marked results line of a run's output: the
// results after the last N the run finished.
func lastResults(out string) (*Results, error) {
	i := strings.LastIndex(out, "\n"+resultsMarker)
	if i < 0 {
		return nil, fmt.Errorf("no %q line in the output", strings.TrimSpace(resultsMarker))
	}
	line := out[i+1+len(resultsMarker):]
	if j := strings.IndexByte(line, '\n'); j >= 0 {
		line = line[:j]
	}
	var res Results
	if err := json.Unmarshal([]byte(line), &res); err != nil {
		return nil, fmt.Errorf("results line: %w", err)
	}
	return &res, nil
}

// TestBenchInTheVM is make bench-vm: TestBench with the ipvs proxies on
// the VM's kernel, its report written to -bench.vm.out.
func TestBenchInTheVM(t *testing.T) {
	if *flagVMN == "" {
		t.Skip("the benchmark in the VM: run with -bench.vm.n (make bench-vm)")
	}
	// The VM's runs are parts of this one: its id and commit.
	run := newRun(t, defaultRule)
	args := append([]string{"-bench.proxies=" + *flagVMProxies, "-bench.run.id=" + run.ID, "-bench.run.commit=" + run.Commit,
		fmt.Sprintf("-bench.run.dirty=%v", run.Dirty)}, strings.Fields(*flagVMArgs)...)
	var res *Results
	var notes []string
	load := watchLoad(t)
	if *flagVMSeed {
		// One boot per N, each on its own seed.
		for _, f := range strings.Split(*flagVMN, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				t.Fatalf("-bench.vm.n: %q is not a Service count", f)
			}
			seed := filepath.Join(t.TempDir(), "etcd")
			took := seedEtcd(t, n, seed)
			t.Logf("N=%d: seed populated on the host in %v", n, took.Round(time.Millisecond))
			notes = append(notes, fmt.Sprintf("N=%d: the API server was populated on the host (in %v, niced), "+
				"and the VM's etcd started on a copy of its data (-bench.vm.seed).", n, took.Round(time.Second)))
			r, out := runInVM(t, append(slices.Clone(args), fmt.Sprintf("-bench.n=%d", n), "-bench.seed="+seed))
			if r == nil {
				break
			}
			// The VM's own population was none: the seed's Services were there.
			notes = append(notes, slices.DeleteFunc(timings(out), func(n string) bool { return strings.Contains(n, "populated") })...)
			if res, err = joinParts(res, r); err != nil {
				t.Fatal(err)
			}
			writeVMReport(t, res, notes, load)
		}
		return
	}
	res, out := runInVM(t, append(slices.Clone(args), "-bench.n="+*flagVMN))
	if res == nil {
		return
	}
	writeVMReport(t, res, timings(out), load)
}

// joinParts is base with r's records added (base nil: r): the VM's boots
// of one run, one per N, each part stamped with the host's run id (a part
// of another run is refused).
func joinParts(base, r *Results) (*Results, error) {
	if base == nil {
		return r, nil
	}
	if r.Run.ID != base.Run.ID || r.Run.Commit != base.Run.Commit {
		return nil, fmt.Errorf("the VM's results of N = %v are of run %s at %s, not of this run %s at %s",
			r.Ns, r.Run.ID, r.Run.Commit, base.Run.ID, base.Run.Commit)
	}
	base.Ns = append(base.Ns, r.Ns...)
	base.FullSyncs = append(base.FullSyncs, r.FullSyncs...)
	base.Incrementals = append(base.Incrementals, r.Incrementals...)
	base.Floors = append(base.Floors, r.Floors...)
	base.DataPaths = append(base.DataPaths, r.DataPaths...)
	base.Bulks = append(base.Bulks, r.Bulks...)
	base.Idles = append(base.Idles, r.Idles...)
	base.Stops = append(base.Stops, r.Stops...)
	base.Run.Ended, base.Run.Complete = r.Run.Ended, r.Run.Complete
	return base, nil
}

// writeVMReport writes the VM run's report to -bench.vm.out.
func writeVMReport(t *testing.T, res *Results, notes []string, load *loadWatch) {
	t.Helper()
	res.Machine.Load = "the host's " + load.String()
	res.Command = "make bench-vm BENCH_VM_N=" + *flagVMN
	if *flagVMArgs != "" {
		res.Command += " BENCH_VM_ARGS='" + *flagVMArgs + "'"
	}
	if *flagVMSeed {
		res.Command += " BENCH_VM_SEED=1"
	}
	for _, n := range notes {
		if !slices.Contains(res.Notes, n) {
			res.Notes = append(res.Notes, n)
		}
	}
	if err := os.MkdirAll(*flagVMOut, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := writeAll(*flagVMOut, res); err != nil {
		t.Fatal(err)
	}
	t.Logf("report written to %s", filepath.Join(*flagVMOut, "REPORT.md"))
}

// TestBenchSmokeInTheVM runs the ipvs proxies through the whole pipeline in
// the VM, small (N = 1 and 100, one of everything), and checks every
// measure came back. Minutes under emulation: only with -bench.vm.smoke.
func TestBenchSmokeInTheVM(t *testing.T) {
	if !*flagVMSmoke {
		t.Skip("the benchmark's smoke in the VM: run with -bench.vm.smoke")
	}
	proxies := []string{KPIPVS, UpstreamIPVS}
	const changes = 3
	res, _ := runInVM(t, []string{"-bench.n=1,100", "-bench.proxies=" + strings.Join(proxies, ","),
		"-bench.rounds=1-1", fmt.Sprintf("-bench.changes=%d", changes), "-bench.window=300ms", "-bench.idle=200ms"})
	if res == nil {
		return
	}
	for _, p := range proxies {
		if got := res.fullSync(p, 100, func(f FullSync) float64 { return float64(f.Elements) }); len(got) != 1 || got[0] < 100 {
			t.Errorf("%s: full sync at N=100 saw %v Services in the kernel, want 100", p, got)
		}
		if got := res.incremental(p, 100, func(i Incremental) float64 { return i.SyncSeconds }); len(got) != changes || slices.Min(got) <= 0 {
			t.Errorf("%s: sync times per change %v, want %d read from the duration metric", p, got, changes)
		}
		if len(res.dataPath(p, 100)) != 1 || Median(res.dataPath(p, 100)) <= 0 {
			t.Errorf("%s: no data-path measurement at N=100: %v", p, res.dataPath(p, 100))
		}
		if got := res.fullSync(p, 100, func(f FullSync) float64 { return float64(f.PeakRSS) }); len(got) != 1 || got[0] <= 0 {
			t.Errorf("%s: peak RSS %v", p, got)
		}
	}
	var report strings.Builder
	if err := WriteReport(&report, res); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Targets (issue 15", "| kp-ipvs |", "kp-ipvs / upstream-ipvs", "software"} {
		if !strings.Contains(report.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, report.String())
		}
	}
}

// runInVM boots the VM and runs TestBench there with args; it returns the
// last results the run emitted (nil, with t failed, when none) and the
// run's output.
func runInVM(t *testing.T, args []string) (*Results, string) {
	t.Helper()
	if os.Getenv("KP_VM") == "1" {
		t.Skip("already in the VM")
	}
	vm.Require(t)
	apiserver.Bin(t, apiserver.KubeProxy)
	// kp and the echo server are built here and run there; the binaries
	// go to a folder of this test's: the guest sweeps netns.Build's
	// folders as stale (their pid is the host's).
	binDir := filepath.Join(t.TempDir(), "bin")
	if err := os.Mkdir(binDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, pkg := range []string{"./cmd/kp", "./test/echo"} {
		p, err := netns.Build(pkg)
		if err == nil {
			var data []byte
			if data, err = os.ReadFile(p); err == nil {
				err = os.WriteFile(filepath.Join(binDir, filepath.Base(p)), data, 0o755)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	bin := vm.BuildTest(t, "./test/bench")
	wd, _ := os.Getwd()
	desc := fmt.Sprintf("qemu-system-x86_64 in software emulation (TCG, no KVM), %d vCPUs, %d MiB, the host's userland over virtiofs",
		vmCPUs, *flagVMMemory)
	start := time.Now()
	out, err := vm.Run(t, vm.Options{Timeout: *flagVMTimeout, CPUs: vmCPUs, MemoryMiB: *flagVMMemory, Dir: wd,
		Env: []string{netns.BinDirEnv + "=" + binDir}},
		bin, append([]string{"-test.v", "-test.count=1", "-test.run", "^TestBench$",
			"-test.timeout=" + (*flagVMTimeout - 2*time.Minute).String(),
			"-bench.out=/tmp", "-bench.emit", "-bench.vm=" + desc}, args...)...)
	t.Logf("the benchmark in the VM took %v", time.Since(start).Round(time.Second))
	for _, line := range timings(out) {
		t.Log(line)
	}
	res, rerr := lastResults(out)
	if err != nil {
		t.Errorf("TestBench in the VM: %v\n%s", err, tail(withoutResults(out)))
	}
	if rerr != nil {
		t.Errorf("no results came back from the VM: %v\n%s", rerr, tail(withoutResults(out)))
		return nil, out
	}
	if testing.Verbose() {
		t.Log(withoutResults(out))
	}
	return res, out
}

// withoutResults is out without its results lines (long JSON).
func withoutResults(out string) string {
	lines := strings.Split(out, "\n")
	return strings.Join(slices.DeleteFunc(lines, func(l string) bool { return strings.HasPrefix(l, resultsMarker) }), "\n")
}

// timing lines of TestBench's log worth keeping in the VM's report: how
// long the emulated API server took to start and to be populated.
var timing = regexp.MustCompile(`(API server \(etcd and kube-apiserver\) ready in \S+|N=\d+: API server populated in \S+)`)

// timings are the run's timing lines, as notes.
func timings(out string) []string {
	var notes []string
	for _, m := range timing.FindAllString(out, -1) {
		notes = append(notes, "In the VM: "+m+".")
	}
	return notes
}

func TestResultsComeOutOfTheVMOnTheirMarkedLine(t *testing.T) {
	first := &Results{Ns: []int{100}, Command: "first"}
	last := &Results{Ns: []int{100, 1000}, Command: "last"}
	var out strings.Builder
	out.WriteString("=== RUN   TestBench\n    bench_test.go:1: N=100: API server populated in 3.2s\n")
	for _, r := range []*Results{first, last} {
		if err := emitResults(&out, r); err != nil {
			t.Fatal(err)
		}
		out.WriteString("    bench_test.go:2: log line\n")
	}
	got, err := lastResults(out.String())
	if err != nil || got.Command != "last" || len(got.Ns) != 2 {
		t.Errorf("lastResults = %+v, %v; want the last results emitted", got, err)
	}
	if _, err := lastResults("--- FAIL: TestBench\n"); err == nil {
		t.Error("output without results: no error")
	}
	if n := timings(out.String()); len(n) != 1 || !strings.Contains(n[0], "N=100: API server populated in 3.2s") {
		t.Errorf("timings = %q", n)
	}
	if strings.Contains(withoutResults(out.String()), resultsMarker) {
		t.Error("withoutResults kept a results line")
	}
}
