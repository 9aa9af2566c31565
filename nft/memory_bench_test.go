package nft

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Memory benchmarks: what kp keeps after a full sync, and the peak of a
// process that makes one. They measure, they assert nothing (make test
// runs no benchmark); -bench.memory-sizes picks the sizes.
var (
	benchMemorySizes = flag.String("bench.memory-sizes", "10000,30000", "Services (of 10 endpoints) in the memory benchmarks")
	benchHeapProfile = flag.String("bench.heap-profile", "", "write BenchmarkRetainedHeapAfterAFullSync's heap profile, taken while the backend is alive, to this prefix")
)

func memorySizes(b *testing.B) []int {
	var out []int
	for _, f := range strings.Split(*benchMemorySizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			b.Fatalf("-bench.memory-sizes: %q is not a number of Services", f)
		}
		out = append(out, n)
	}
	return out
}

// BenchmarkRetainedHeapAfterAFullSync reports the heap kp's nftables
// backend keeps after a full sync of N Services × 10 (what the next syncs
// diff against: footprints, element owners, the model of the kernel, the
// endpoint slots), without the State, which the tracker owns.
func BenchmarkRetainedHeapAfterAFullSync(b *testing.B) {
	for _, n := range memorySizes(b) {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			s := scaleState(n, 10)
			var retained float64
			for range b.N {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				be, _ := newBackend(testConfig(), nil, &nullConn{})
				if err := be.Sync(b.Context(), s); err != nil {
					b.Fatal(err)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				retained = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / (1 << 20)
				if *benchHeapProfile != "" {
					writeHeapProfile(b, fmt.Sprintf("%s-%d.pprof", *benchHeapProfile, n))
				}
				runtime.KeepAlive(be)
			}
			b.ReportMetric(retained, "MiB-retained")
		})
	}
}

// BenchmarkPeakRSSOfAFullSync runs a full sync of N Services × 10 into a
// real table (a throwaway namespace) in a child process of its own, and
// reports the child's resident memory: before the sync (the test binary
// and the State), its peak (VmHWM) and after the sync (idle, once the
// runtime gave the sync's garbage back). The State is a stand-in for
// what kp's tracker holds, not kp's informers: see
// proxy's BenchmarkInformerCacheHeap for those.
func BenchmarkPeakRSSOfAFullSync(b *testing.B) {
	for _, n := range memorySizes(b) {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			var m map[string]float64
			for range b.N {
				cmd := exec.Command(os.Args[0], "-test.run=^TestPeakRSSChild$", "-test.v")
				cmd.Env = append(os.Environ(), fmt.Sprintf("KP_PEAK_RSS_SERVICES=%d", n))
				out, err := cmd.CombinedOutput()
				if err != nil {
					b.Fatalf("child: %v\n%s", err, out)
				}
				m = parseMetrics(string(out))
				if len(m) == 0 {
					b.Fatalf("child printed no measure:\n%s", out)
				}
			}
			for k, v := range m {
				b.ReportMetric(v, k)
			}
		})
	}
}

// TestPeakRSSChild is BenchmarkPeakRSSOfAFullSync's child process.
func TestPeakRSSChild(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("KP_PEAK_RSS_SERVICES"))
	if n == 0 {
		t.Skip("skipped: the child process of BenchmarkPeakRSSOfAFullSync")
	}
	_, _, be := kernelBackend(t)
	s := scaleState(n, 10)
	debug.FreeOSMemory()
	base := procStatusKiB(t, "VmRSS")
	start := time.Now()
	if err := be.Sync(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	peak := procStatusKiB(t, "VmHWM")
	debug.FreeOSMemory()
	idle := procStatusKiB(t, "VmRSS")
	fmt.Printf("measure MiB-base-rss=%.1f MiB-peak-rss=%.1f MiB-idle-rss=%.1f MiB-sync-peak=%.1f s-sync=%.2f\n",
		base/1024, peak/1024, idle/1024, (peak-base)/1024, took.Seconds())
	runtime.KeepAlive(s)
	runtime.KeepAlive(be)
}

func writeHeapProfile(b *testing.B, path string) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		b.Fatal(err)
	}
}

func procStatusKiB(t testing.TB, field string) float64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kib, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			if err != nil {
				t.Fatal(err)
			}
			return kib
		}
	}
	t.Fatalf("/proc/self/status has no %s", field)
	return 0
}

// parseMetrics reads the child's "measure name=value ..." line.
func parseMetrics(out string) map[string]float64 {
	m := map[string]float64{}
	for _, line := range strings.Split(out, "\n") {
		rest, ok := strings.CutPrefix(line, "measure ")
		if !ok {
			continue
		}
		for _, kv := range strings.Fields(rest) {
			k, v, _ := strings.Cut(kv, "=")
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				m[k] = f
			}
		}
	}
	return m
}
