package bench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Bounds of waitQuiet: the smallest N it waits at, the share of the
// machine's CPU time that must be idle over one sample, and the longest
// wait.
const (
	quietFrom    = 10000
	quietIdle    = 0.9
	quietSample  = 250 * time.Millisecond
	quietTimeout = 20 * time.Second
)

// waitQuiet waits, from quietFrom Services on, until the machine's CPUs
// are idle (quietIdle over a quietSample) or quietTimeout passed, and
// returns how long it waited. A cold start is timed from the proxy's
// start, and the kernel frees a flushed ruleset, or a deleted namespace's,
// in the background after the call returns: at 10,000 Services the cold
// starts of kp after a flush took 2.8–3.5 s in one run where the first
// took 2.3 s. Below quietFrom there is little to free, and make test's
// smoke runs beside other packages, where the machine is never quiet.
func waitQuiet(t *testing.T, n int) time.Duration {
	t.Helper()
	if n < quietFrom {
		return 0
	}
	start := time.Now()
	prev, ok := cpuTimes()
	for ok && time.Since(start) < quietTimeout {
		time.Sleep(quietSample)
		cur, ok2 := cpuTimes()
		if !ok2 {
			break
		}
		total, idle := cur[0]-prev[0], cur[1]-prev[1]
		if total > 0 && float64(idle)/float64(total) >= quietIdle {
			return time.Since(start)
		}
		prev = cur
	}
	return time.Since(start)
}

// cpuTimes is /proc/stat's first line as {all, idle+iowait} clock ticks.
func cpuTimes() ([2]uint64, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return [2]uint64{}, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return [2]uint64{}, false
	}
	var out [2]uint64
	for i, v := range f[1:] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return [2]uint64{}, false
		}
		out[0] += n
		if i == 3 || i == 4 { // idle, iowait
			out[1] += n
		}
	}
	return out, true
}

// loadWatch samples this machine's 1-minute load average while a run
// lasts, so the report says how busy the machine was (under load, every
// proxy's times stretch, and not evenly).
type loadWatch struct {
	mu       sync.Mutex
	min, max float64
	samples  int
}

// watchLoad samples /proc/loadavg every loadEvery until t ends.
func watchLoad(t *testing.T) *loadWatch {
	w := &loadWatch{}
	w.sample()
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go func() {
		tick := time.NewTicker(loadEvery)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				w.sample()
			}
		}
	}()
	return w
}

const loadEvery = 30 * time.Second

func (w *loadWatch) sample() {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.samples == 0 || v < w.min {
		w.min = v
	}
	if w.samples == 0 || v > w.max {
		w.max = v
	}
	w.samples++
}

// String is the range seen, for Machine.Load.
func (w *loadWatch) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.samples == 0 {
		return ""
	}
	return fmt.Sprintf("1-minute load average %.2f–%.2f over the run (%d samples, one every %v)", w.min, w.max, w.samples, loadEvery)
}
