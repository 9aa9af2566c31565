package bench

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kpproxy/kp/test/netns"
)

// What a churn phase reads of the proxy (its CPU, its histogram, a
// profile) and its restart for the phases.

// cpuWindows samples the CPU time of process pid every window; the
// function it returns stops the sampling and gives each window's CPU
// seconds per change acknowledged in it (windows without a change left
// out).
func (p *proxyRun) cpuWindows(pid int, window time.Duration, acked *atomic.Int64) func() []float64 {
	stop, done := make(chan struct{}), make(chan []float64)
	go func() {
		var out []float64
		last, lastN := readProcCPU(pid), acked.Load()
		tick := time.NewTicker(max(window, 100*time.Millisecond))
		defer tick.Stop()
		for {
			select {
			case <-stop:
				done <- out
				return
			case <-tick.C:
				cpu, k := readProcCPU(pid), acked.Load()
				if k > lastN && cpu >= last {
					out = append(out, (cpu-last)/float64(k-lastN))
				}
				last, lastN = cpu, k
			}
		}
	}()
	return func() []float64 { close(stop); return <-done }
}

func readProcCPU(pid int) float64 {
	st, _ := readProc(pid)
	return st.cpu
}

// histogram reads the buckets of the proxy's histogram name (unlabelled or
// IPv4), nil when it has none.
func (p *proxyRun) histogram(name string) []Bucket {
	code, body, err := netns.HTTPGet(p.w.Node(), "http://"+metricsAddr+"/metrics", 10*time.Second)
	if err != nil || code != 200 {
		p.t.Logf("%s: read its metrics: HTTP %d %v", p.name, code, err)
		return nil
	}
	return parseHistogram(body, name)
}

// parseHistogram picks histogram name's buckets out of a metrics page
// (the IPv4 series where there is a family label).
func parseHistogram(body, name string) []Bucket {
	var out []Bucket
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, name+"_bucket{") || strings.Contains(line, `"IPv6"`) {
			continue
		}
		_, rest, ok := strings.Cut(line, `le="`)
		if !ok {
			continue
		}
		le, rest, ok := strings.Cut(rest, `"`)
		sp := strings.LastIndexByte(rest, ' ')
		if !ok || sp < 0 {
			continue
		}
		bound, err1 := parseLE(le)
		var count float64
		_, err2 := fmt.Sscan(rest[sp+1:], &count)
		if err1 == nil && err2 == nil {
			out = append(out, Bucket{bound, count})
		}
	}
	return out
}

// restartWithMinSync restarts the proxy with its --min-sync-period (or
// upstream's name for it) set to d and the flags extra, over the rules it left, and waits
// for its first sync to hold every one of the n Services; nothing when it
// runs with d already.
func (p *proxyRun) restartWithMinSync(n int, d, timeout time.Duration, extra ...string) {
	p.t.Helper()
	args := withMinSync(p.args, d, extra...)
	if slices.Equal(args, p.args) {
		return
	}
	if err := p.proc.Stop(); err != nil {
		p.t.Logf("%s exited: %v", p.name, err)
	}
	p.args = args
	start := time.Now()
	p.proc = netns.StartIn(p.t, p.w.Node(), p.bin, p.args...)
	for deadline := start.Add(timeout); ; time.Sleep(50 * time.Millisecond) {
		if !p.proc.Running() {
			p.t.Fatalf("%s exited after its restart with --min-sync-period %v: %v\n%s", p.name, d, p.proc.ExitErr(), tail(p.proc.Log()))
		}
		if p.lastSync() > float64(start.UnixNano())/1e9 {
			if count, err := p.count(); err == nil && count >= n {
				return
			}
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s: not synced %v after its restart with --min-sync-period %v", p.name, timeout, d)
		}
	}
}

// profile writes the proxy's CPU profile of the middle half of a phase of
// length d into file (for NOTES.md's explanations; logged, not checked).
func (p *proxyRun) profile(file string, d time.Duration) {
	time.Sleep(d / 4)
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", metricsAddr, max(int(d.Seconds()/2), 1))
	code, body, err := netns.HTTPGet(p.w.Node(), url, d)
	if err == nil && code != 200 {
		err = fmt.Errorf("HTTP %d", code)
	}
	if err == nil {
		err = os.WriteFile(file, []byte(body), 0o644)
	}
	p.t.Logf("%s: CPU profile %s: %v", p.name, file, err)
}

// withMinSync is a proxy's args with every *min-sync-period flag (kp's
// --min-sync-period, upstream's --iptables-min-sync-period) set to d and
// the flags extra added where missing.
func withMinSync(args []string, d time.Duration, extra ...string) []string {
	out := slices.Clone(args)
	for _, a := range extra {
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	for i := 0; i+1 < len(out); i++ {
		if strings.HasSuffix(out[i], "min-sync-period") {
			out[i+1] = d.String()
		}
	}
	return out
}
