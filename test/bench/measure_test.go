package bench

import (
	"cmp"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/kpproxy/kp/test/netns"
)

// coldStart starts the proxy with n Services in the API server and waits
// until the kernel holds all of them and the sampled ones answer.
func (p *proxyRun) coldStart(c *cluster, n int, syncTimeout time.Duration) FullSync {
	p.t.Helper()
	if waited := waitQuiet(p.t, n); waited > time.Second {
		p.t.Logf("%s N=%d: waited %v for the machine to be quiet before the cold start", p.name, n, waited.Round(100*time.Millisecond))
	}
	return p.firstSync(c, n, syncTimeout)
}

// firstSync starts the proxy and waits, as coldStart does, for its first
// sync after which the kernel holds all n Services (over rules a previous
// process left, at once: a restart's or a take-over's first sync).
func (p *proxyRun) firstSync(c *cluster, n int, syncTimeout time.Duration) FullSync {
	p.t.Helper()
	start := p.start()
	pid := p.proc.Pid()
	res := FullSync{Proxy: p.name, N: n}
	deadline := start.Add(syncTimeout)
	nextLog := start.Add(10 * time.Second)
	for {
		res.ChildRSS = max(res.ChildRSS, childHWM(pid))
		if !p.proc.Running() {
			p.t.Fatalf("%s exited during its full sync: %v\n%s", p.name, p.proc.ExitErr(), tail(p.proc.Log()))
		}
		if time.Now().After(deadline) {
			p.t.Logf("%s: not every one of %d Services programmed after %v (kernel holds %d): unfinished", p.name, n, syncTimeout, res.Elements)
			res.Unfinished, res.Seconds = true, syncTimeout.Seconds()
			if st, err := readProc(pid); err == nil {
				res.CPUSeconds, res.PeakRSS = st.cpu, st.hwm
			}
			return res
		}
		last := p.lastSync()
		if time.Now().After(nextLog) {
			count, err := p.count()
			p.t.Logf("%s N=%d: waiting for the full sync: last sync %.3f, kernel holds %d (%v)", p.name, n, last, count, err)
			nextLog = nextLog.Add(10 * time.Second)
		}
		if last > 0 {
			count, err := p.count()
			if err != nil {
				p.t.Fatalf("%s: count Services in the kernel: %v", p.name, err)
			}
			res.Elements = count
			if count >= n {
				// Read again: the sync that completed the set may have
				// ended after the first read.
				last = max(last, p.lastSync())
				res.Seconds = last - float64(start.UnixNano())/1e9
				break
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	st, err := readProc(pid)
	if err != nil {
		p.t.Fatalf("%s: %v", p.name, err)
	}
	res.CPUSeconds, res.PeakRSS = st.cpu, st.hwm
	res.FDs = openFDs(pid)
	if p.complete != nil {
		if err := p.complete(); err != nil {
			p.t.Errorf("%s N=%d: after its full sync: %v", p.name, n, err)
		}
	}
	p.checkSamples(c, n)
	return res
}

// checkSamples sends real TCP connections from the client to each sampled
// Service and expects a pod to answer.
func (p *proxyRun) checkSamples(c *cluster, n int) {
	p.t.Helper()
	for _, i := range samples(n) {
		addr := net.JoinHostPort(c.clusterIP(i), fmt.Sprint(servicePort))
		var reply string
		var err error
		for try := 0; try < 20; try++ {
			if reply, err = netns.Dial(p.w.Client(), "tcp", addr, 2*time.Second); err == nil && strings.HasPrefix(reply, "pod-") {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		if err != nil || !strings.HasPrefix(reply, "pod-") {
			p.t.Errorf("%s: Service %s at %s does not answer after its full sync: %q %v", p.name, serviceName(i), addr, reply, err)
		}
	}
}

// idle measures the proxy's RSS and CPU over window while nothing changes.
func (p *proxyRun) idle(n int, window time.Duration) Idle {
	p.t.Helper()
	pid := p.proc.Pid()
	before, err := readProc(pid)
	if err != nil {
		p.t.Fatalf("%s: %v", p.name, err)
	}
	time.Sleep(window)
	after, err := readProc(pid)
	if err != nil {
		p.t.Fatalf("%s: %v", p.name, err)
	}
	return Idle{Proxy: p.name, N: n, RSS: after.rss, CPUSeconds: after.cpu - before.cpu, Window: window.Seconds()}
}

// floorLoad is a reference of the cold-start rounds: a kp mode's ruleset,
// as its listing tool printed it in the proxy's namespace after its first
// full sync, loaded by its loading tool into an empty namespace of its
// own, once a round: what the kernel and that tool take for those rules,
// whoever renders them.
type floorLoad struct {
	ref     string // floorNFT, floorIPT, floorIPTNoFlush
	proxy   string // whose ruleset
	noFlush bool
	ns      string
	cmd     []string
	lines   int
}

// floorLoads lists proxy p's ruleset (after its first full sync: nil after
// a later one, the references have it) and prepares
// the loads of its references: `nft -f` for kp; for kp-iptables
// iptables-nft-restore, and with --noflush, which is what a proxy sharing
// the tables must use, and several times slower in iptables-nft (it then
// works against a cache of the kernel's ruleset, rule by rule).
func (p *proxyRun) floorLoads(refs map[string]*participant) []*floorLoad {
	p.t.Helper()
	for _, ref := range refsOf(p.name) {
		if refs[ref] == nil || refs[ref].floor != nil {
			return nil // listed after its first cold start already
		}
	}
	write := func(name, text string) string {
		file := filepath.Join(p.t.TempDir(), name)
		if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
			p.t.Fatal(err)
		}
		return file
	}
	load := func(ref, ruleset string, noFlush bool, cmd ...string) *floorLoad {
		return &floorLoad{ref: ref, proxy: p.name, noFlush: noFlush, ns: netns.NewNamespace(p.t, "floor"), cmd: cmd,
			lines: strings.Count(ruleset, "\n")}
	}
	switch p.name {
	case KP:
		ruleset, err := p.w.NFT("list", "ruleset")
		if err != nil {
			p.t.Fatalf("list kp's ruleset: %v", err)
		}
		return []*floorLoad{load(floorNFT, ruleset, false, "nft", "-f", write("ruleset.nft", ruleset))}
	case KPIPTables:
		ruleset, err := netns.Exec(p.w.Node(), "iptables-nft-save")
		if err != nil {
			p.t.Fatalf("list kp-iptables's ruleset: %v", err)
		}
		// With --noflush, iptables-nft 1.8.9 walks a sorted list of every
		// chain named so far for each line: quadratic, minutes at 10,000
		// Services. kp's own restores carry a list command (-S) after each
		// table's header that turns this off (legacy/iptables/diff.go); the
		// --noflush floor is loaded the same way.
		return []*floorLoad{
			load(floorIPT, ruleset, false, "iptables-nft-restore", write("ruleset.iptables", ruleset)),
			load(floorIPTNoFlush, ruleset, true, "iptables-nft-restore", "--noflush",
				write("ruleset-hinted.iptables", withCacheHint(ruleset))),
		}
	}
	return nil
}

// load empties the floor's namespace and loads the ruleset once, timed.
// iptables-nft-restore 1.8.9 has crashed here (a segmentation fault on the
// 10,000-Service listing with --noflush and the hint): an error ends this
// reference's rounds, not the proxy's.
func (f *floorLoad) load(n int) (Floor, error) {
	if _, err := netns.Exec(f.ns, "nft", "flush", "ruleset"); err != nil {
		return Floor{}, fmt.Errorf("floor %s: %v", f.ref, err)
	}
	// ip netns exec execs the command in its own process: its rusage is
	// the load's CPU (the kernel's commit runs in the sender's context).
	cmd := exec.Command("ip", append([]string{"netns", "exec", f.ns}, f.cmd...)...)
	start := time.Now()
	if msg, err := cmd.CombinedOutput(); err != nil {
		return Floor{}, fmt.Errorf("floor: %s of %s's ruleset: %v: %.300s", strings.Join(f.cmd, " "), f.proxy, err, msg)
	}
	took := time.Since(start)
	cpu := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	return Floor{Proxy: f.proxy, NoFlush: f.noFlush, N: n, Seconds: took.Seconds(), CPUSeconds: cpu.Seconds(), Lines: f.lines}, nil
}

// withCacheHint puts "-S" after the chain declarations of each table of an
// iptables-save listing: the built-in chains' jumps come after it, and
// iptables-nft creates a missing built-in chain before the hint only when a
// rule names it before the hint, so the built-in chains' rules go first.
func withCacheHint(save string) string {
	var out, builtin, rest []string
	flush := func() {
		out = append(out, builtin...)
		out = append(out, "-S")
		out = append(out, rest...)
		builtin, rest = nil, nil
	}
	inTable := false
	for _, l := range strings.Split(save, "\n") {
		switch {
		case strings.HasPrefix(l, "*"):
			out, inTable = append(out, l), true
		case l == "COMMIT":
			flush()
			out, inTable = append(out, l), false
		case !inTable:
			out = append(out, l)
		case strings.HasPrefix(l, ":"):
			out = append(out, l)
		case isBuiltinRule(l):
			builtin = append(builtin, l)
		default:
			rest = append(rest, l)
		}
	}
	return strings.Join(out, "\n")
}

func isBuiltinRule(l string) bool {
	for _, c := range []string{"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"} {
		if strings.HasPrefix(l, "-A "+c+" ") {
			return true
		}
	}
	return false
}

// dataPath measures the connection rate through addr in world w's client
// for one window, the node's conntrack table emptied first.
func dataPath(w *netns.World, proxy string, n int, addr string, cfg config) DataPath {
	flushConntrack(w.Node())
	u := tcpWindow(w.Client(), []string{addr}, cfg.Workers, cfg.Window)
	return DataPath{Proxy: proxy, N: n, ConnPerSec: u.PerSec, Errors: u.Errors}
}

// dataPathTarget is a world whose kernel forwards addr: the rules a proxy
// left there when it stopped, or none (NoProxy, a pod's address); for
// kp-userspace, its running process.
type dataPathTarget struct {
	proxy string
	w     *netns.World
	addr  string
}

// incremental changes one endpoint changes times. Each change is timed to
// the end of the proxy's sync (its last-sync metric, which both proxies set
// after the kernel answered) and by the proxy's own sync time (its sync
// duration metric); its size is what nft monitor lists (N <= monitorMaxN).
func (p *proxyRun) incremental(c *cluster, n, changes int, timeout time.Duration) []Incremental {
	p.t.Helper()
	var m *monitor
	if n <= monitorMaxN && writesNFTables(p.name) {
		var err error
		if m, err = startMonitor(p.w.Node()); err != nil {
			p.t.Fatalf("nft monitor: %v", err)
		}
		defer m.stop()
		if err := m.subscribed(p.w.Node()); err != nil {
			p.t.Fatalf("nft monitor: %v", err)
		}
	}
	var out []Incremental
	for k := 0; k < changes; k++ {
		if m != nil {
			m.drain()
		}
		synced := p.syncSeconds()
		sent, err := c.changeOne(changeTarget(k, n))
		if err != nil {
			p.t.Fatalf("%s: %v", p.name, err)
		}
		at, err := p.nextSync(sent, cmp.Or(timeout, time.Minute))
		if err != nil {
			p.t.Errorf("%s: change %d at N=%d: %v", p.name, k, n, err)
			return out
		}
		events := -1 // not measured
		if m != nil {
			if _, events, err = m.nextCommit(10 * time.Second); err != nil {
				p.t.Errorf("%s: change %d at N=%d: nft monitor: %v", p.name, k, n, err)
				events = -1
			}
		}
		// Let a sync that writes more than one transaction finish, and
		// stay clear of the rate limit, before the next change.
		time.Sleep(250 * time.Millisecond)
		out = append(out, Incremental{Proxy: p.name, N: n, Seconds: at.Sub(sent).Seconds(), Events: events,
			SyncSeconds: p.syncSeconds() - synced})
	}
	return out
}

// nextSync waits until the proxy's last-sync metric reports a sync that
// ended after since, and returns when it ended.
func (p *proxyRun) nextSync(since time.Time, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if last := p.lastSync(); last > float64(since.UnixNano())/1e9 {
			return time.Unix(0, int64(last*1e9)), nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Time{}, fmt.Errorf("no sync within %v", timeout)
}

func tail(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return strings.Join(lines, "\n")
}

// openFDs counts the open file descriptors of process pid (0 when /proc
// cannot tell).
func openFDs(pid int) int {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0
	}
	return len(fds)
}
