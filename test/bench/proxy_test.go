package bench

import (
	"fmt"
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
)

// Addresses every proxy serves on inside its own node namespace.
const (
	metricsAddr = "127.0.0.1:10249"
	healthzAddr = "127.0.0.1:10256"
)

// Sync periods every proxy gets alike: a short rate limit, so the
// incremental changes (spaced further apart than it) measure the proxy and
// not its limiter, and no periodic resync during a measurement.
const (
	minSyncPeriod = "100ms"
	syncPeriod    = "1h"
)

// proxyRun is one proxy under test in its world.
type proxyRun struct {
	t     *testing.T
	name  string
	w     *netns.World
	bin   string
	args  []string
	proc  *netns.Process
	count func() (int, error) // Services programmed in the kernel
	// complete, when set, checks once a cold start is done what count
	// does not (each IPVS virtual server has its real servers).
	complete func() error
}

// newProxy prepares (does not start) proxy name in world w as node node.
func newProxy(t *testing.T, c *cluster, w *netns.World, node, name string) *proxyRun {
	t.Helper()
	kubeconfig := c.srv.Kubeconfig(0, c.srv.AdminToken())
	p := &proxyRun{t: t, name: name, w: w}
	common := []string{
		"--kubeconfig", kubeconfig,
		"--hostname-override", node,
		"--cluster-cidr", w.PodCIDR().String(),
		"--healthz-bind-address", healthzAddr,
		"--metrics-bind-address", metricsAddr,
		// Leave the namespace's conntrack sysctls alone (kp has upstream's
		// flags for them since issue 18).
		"--conntrack-max-per-core", "0",
		"--conntrack-tcp-timeout-established", "0",
		"--conntrack-tcp-timeout-close-wait", "0",
	}
	switch name {
	case KP, KPIPTables, KPIPTablesLegacy, KPUserspace, KPIPVS:
		p.bin = kpBin(t)
		p.args = append(append([]string{"proxy"}, common...),
			"--min-sync-period", minSyncPeriod, "--sync-period", syncPeriod, "--status-socket", statusSocket(t))
		p.count = func() (int, error) { return countNFT(w.Node(), "kp") }
		if name == KPIPTables {
			// The backend upstream's iptables mode gets here too: Debian's
			// `iptables` is iptables-nft (Machine.IPTables says so).
			p.args = append(p.args, "--proxy-mode", "iptables", "--iptables-backend", "nft")
			p.count = func() (int, error) { return countIPTables(w.Node(), "iptables-nft-save", "KP-") }
		}
		if name == KPUserspace {
			p.args = append(p.args, "--proxy-mode", "userspace", "--userspace-redirect", "nftables")
			p.count = func() (int, error) { return countUserspace(w.Node()) }
		}
		if name == KPIPVS {
			p.args = append(p.args, "--proxy-mode", "ipvs")
			p.count = func() (int, error) { return countIPVS(w.Node()) }
			p.complete = func() error { return ipvsComplete(w.Node()) }
		}
	case UpstreamNFT, UpstreamIPTables, UpstreamIPTablesLegacy:
		mode := "nftables"
		p.count = func() (int, error) { return countNFT(w.Node(), "kube-proxy") }
		if name != UpstreamNFT {
			mode = "iptables"
			p.count = func() (int, error) { return countIPTables(w.Node(), "iptables-save", "KUBE-") }
		}
		p.bin = apiserver.Bin(t, apiserver.KubeProxy)
		p.args = append(common,
			"--proxy-mode", mode,
			// Upstream's names for the same two periods.
			"--iptables-min-sync-period", minSyncPeriod, "--iptables-sync-period", syncPeriod)
	case UpstreamIPVS:
		p.bin = apiserver.Bin(t, apiserver.KubeProxy)
		p.count = func() (int, error) { return countIPVS(w.Node()) }
		p.complete = func() error { return ipvsComplete(w.Node()) }
		p.args = append(common,
			"--proxy-mode", "ipvs",
			// Its ipvs mode's own names for the two periods.
			"--ipvs-min-sync-period", minSyncPeriod, "--ipvs-sync-period", syncPeriod)
	default:
		t.Fatalf("unknown proxy %q", name)
	}
	if isIPTablesLegacy(name) {
		p.throughLegacy()
	}
	return p
}

// start runs the proxy and returns the time just before it was started.
func (p *proxyRun) start() time.Time {
	p.t.Helper()
	at := time.Now()
	if p.proc == nil {
		p.proc = netns.StartIn(p.t, p.w.Node(), p.bin, p.args...)
		return at
	}
	if err := p.proc.Start(); err != nil {
		p.t.Fatalf("restart %s: %v", p.name, err)
	}
	return at
}

// kpBin builds kp once per test binary (netns.Build caches it).
func kpBin(t *testing.T) string {
	t.Helper()
	bin, err := netns.Build("./cmd/kp")
	if err != nil {
		t.Fatalf("kp does not build: %v", err)
	}
	return bin
}

// halt stops the proxy and leaves what it wrote in the kernel, for the data
// path measured after every proxy of an N (dataPathRounds); the world's
// namespaces go, with their rules, when the N's subtest ends.
func (p *proxyRun) halt() {
	p.t.Helper()
	if err := p.proc.Stop(); err != nil {
		p.t.Logf("%s exited: %v", p.name, err)
	}
}

// stop stops the proxy and empties its namespace's ruleset (nftables, with
// iptables-nft's tables, and iptables-legacy's tables), its IPVS state
// (virtual servers, dummy interfaces, ipsets) and conntrack table, so the
// next start is cold. It checks that the kernel then holds none of the
// proxy's Services (and, for an ipvs mode, nothing else of it).
func (p *proxyRun) stop() {
	p.t.Helper()
	if p.proc != nil {
		if err := p.proc.Stop(); err != nil {
			p.t.Logf("%s exited: %v", p.name, err)
		}
	}
	if _, err := p.w.NFT("flush", "ruleset"); err != nil {
		p.t.Fatalf("flush %s's ruleset: %v", p.name, err)
	}
	if err := flushLegacy(p.w.Node()); err != nil {
		p.t.Fatalf("after %s: %v", p.name, err)
	}
	if err := flushIPVS(p.w.Node()); err != nil {
		p.t.Fatalf("after %s: %v", p.name, err)
	}
	if err := ipvsLeftovers(p.w.Node()); err != nil {
		p.t.Fatalf("after %s stopped and its namespace was flushed: %v", p.name, err)
	}
	if n, err := p.count(); err != nil || n != 0 {
		p.t.Fatalf("after %s stopped and its namespace was flushed, the kernel still holds %d of its Services (%v)", p.name, n, err)
	}
	flushConntrack(p.w.Node())
}

// flushLegacy empties and deletes the chains of every iptables-legacy table
// (IPv4 and IPv6) that exists in namespace ns. nft flush ruleset does not
// reach them: they live in x_tables, not nf_tables. The kernel lists a
// namespace's legacy tables in /proc/net/ip_tables_names (and
// ip6_tables_names) once something used them; listing them loads nothing.
func flushLegacy(ns string) error {
	for names, bin := range map[string]string{"ip_tables_names": "iptables-legacy", "ip6_tables_names": "ip6tables-legacy"} {
		out, err := netns.Exec(ns, "cat", "/proc/net/"+names)
		if err != nil {
			return fmt.Errorf("list legacy tables: %w", err)
		}
		for _, table := range strings.Fields(out) {
			for _, op := range []string{"-F", "-X"} {
				if out, err := netns.Exec(ns, bin, "-w", "-t", table, op); err != nil {
					return fmt.Errorf("%s -t %s %s: %w: %s", bin, table, op, err, out)
				}
			}
		}
	}
	return nil
}

func flushConntrack(ns string) {
	// conntrack -F reports on stderr even on success; an empty table is
	// no error worth stopping a benchmark for.
	_, _ = netns.Exec(ns, "conntrack", "-F")
}

// lastSync is the proxy's kubeproxy_sync_proxy_rules_last_timestamp_seconds
// for IPv4 (the family of every benchmark Service), 0 before its first sync.
func (p *proxyRun) lastSync() float64 {
	return p.metric("kubeproxy_sync_proxy_rules_last_timestamp_seconds")
}

// syncSeconds is the total time the proxy has spent in syncs (IPv4), from
// kubeproxy_sync_proxy_rules_duration_seconds: upstream and kp both time
// a sync from its start to the kernel's answer.
// A read that fails is tried again: a change's sync time is the
// difference of two reads, and a failed one (0) would count every sync
// before it (the VM's emulated proxies answer slowly).
func (p *proxyRun) syncSeconds() float64 {
	var v float64
	var err error
	for try := 0; try < 5; try++ {
		if v, err = p.metricOf("kubeproxy_sync_proxy_rules_duration_seconds_sum"); err == nil {
			return v
		}
	}
	p.t.Logf("%s: read its sync time: %v", p.name, err)
	return v
}

// metric reads one sample of the proxy's metrics: unlabeled, or the IPv4
// one; 0 when the proxy does not answer or has no such sample.
func (p *proxyRun) metric(name string) float64 {
	v, _ := p.metricOf(name)
	return v
}

// metricOf is metric, with the error when the proxy did not answer.
func (p *proxyRun) metricOf(name string) (float64, error) {
	code, body, err := netns.HTTPGet(p.w.Node(), "http://"+metricsAddr+"/metrics", 10*time.Second)
	if err == nil && code != 200 {
		err = fmt.Errorf("metrics: HTTP %d", code)
	}
	if err != nil {
		return 0, err
	}
	var v float64
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, name) || strings.Contains(line, `"IPv6"`) {
			continue
		}
		rest := line[len(name):]
		if rest != "" && rest[0] != ' ' && rest[0] != '{' {
			continue
		}
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			if x, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
				v = max(v, x)
			}
		}
	}
	return v, nil
}

// countNFT counts the benchmark's Services in table ip <table>'s
// service-ips verdict map (kp and upstream nftables mode share the name),
// and in kp's service-slots map (its ClusterIPs the shared pick chains
// serve, which have no verdict of their own).
func countNFT(ns, table string) (int, error) {
	n := 0
	for _, m := range []string{"service-ips", "service-slots"} {
		if m == "service-slots" && table != "kp" {
			continue
		}
		out, err := netns.Exec(ns, "nft", "list", "map", "ip", table, m)
		if err != nil {
			if strings.Contains(out, "No such file") {
				continue
			}
			return 0, err
		}
		n += len(serviceElement.FindAllStringIndex(out, -1))
	}
	return n, nil
}

// countUserspace counts the benchmark's Services in the userspace mode's
// redirect map (address . protocol . port : listener port).
func countUserspace(ns string) (int, error) {
	out, err := netns.Exec(ns, "nft", "list", "map", "ip", "kp-userspace", "redirects")
	if err != nil {
		if strings.Contains(out, "No such file") {
			return 0, nil
		}
		return 0, err
	}
	return len(serviceElement.FindAllStringIndex(out, -1)), nil
}

// serviceElement is one benchmark Service port in a service-ips listing:
// "10.96.3.4 . tcp . 80 : goto …", with or without a comment before the
// colon (in kp-userspace's redirects map: ": 40001").
var serviceElement = regexp.MustCompile(fmt.Sprintf(` \. tcp \. %d (comment "[^"]*" )?: `, servicePort))

// countIPTables counts the benchmark's Services in the nat table as save
// (iptables-save, iptables-nft-save, ...) lists it in namespace ns, for the
// chains under prefix (KUBE- for upstream, KP- for kp).
func countIPTables(ns, save, prefix string) (int, error) {
	out, err := netns.Exec(ns, save, "-t", "nat")
	if err != nil {
		return 0, err
	}
	return iptablesServices(out, prefix), nil
}

// iptablesServices counts, in an iptables-save listing of the nat table,
// the Service chains (prefix+"SVC-") that some other chain jumps to and that
// lead to a benchmark endpoint: a DNAT to port podPort, in the chain itself
// or in an endpoint chain (prefix+"SEP-") it jumps to. Judging by the
// endpoints rather than by comments or by the chain that dispatches to the
// Service holds for upstream's flat KUBE-SERVICES list and for kp's
// dispatch tree alike, and leaves the API server's own Service (its
// endpoint is not on podPort) out.
func iptablesServices(save, prefix string) int {
	svc, sep := prefix+"SVC-", prefix+"SEP-"
	endpoint := fmt.Sprintf(":%d ", podPort)
	dnats := map[string]bool{}     // chains holding a benchmark DNAT
	jumps := map[string][]string{} // Service chain -> chains it jumps to
	reached := map[string]bool{}   // Service chains jumped to from outside
	for _, line := range strings.Split(save, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "-A" {
			continue
		}
		chain := f[1]
		if i := strings.Index(line, "--to-destination "); i >= 0 && strings.Contains(line[i:]+" ", endpoint) {
			dnats[chain] = true
		}
		for i := 2; i+1 < len(f); i++ {
			if f[i] != "-j" && f[i] != "-g" {
				continue
			}
			target := f[i+1]
			if strings.HasPrefix(chain, svc) {
				jumps[chain] = append(jumps[chain], target)
			}
			if strings.HasPrefix(target, svc) && target != chain && !strings.HasPrefix(chain, sep) {
				reached[target] = true
			}
		}
	}
	n := 0
	for chain := range reached {
		if dnats[chain] || slices.ContainsFunc(jumps[chain], func(t string) bool { return strings.HasPrefix(t, sep) && dnats[t] }) {
			n++
		}
	}
	return n
}

// procStats is what /proc says about a process.
type procStats struct {
	cpu      float64 // user+system seconds, with reaped children
	hwm, rss int64   // bytes
}

// clockTick is USER_HZ, 100 on every Linux kp runs on.
const clockTick = 100

func readProc(pid int) (procStats, error) {
	var s procStats
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	// Fields after the command name (which may hold spaces): state is
	// field 3; utime, stime, cutime, cstime are 14–17.
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
	if len(f) < 15 {
		return s, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	for _, v := range f[11:15] {
		t, _ := strconv.ParseFloat(v, 64)
		s.cpu += t / clockTick
	}
	s.hwm, s.rss = statusKB(pid, "VmHWM:"), statusKB(pid, "VmRSS:")
	return s, nil
}

// statusKB reads one kB field of /proc/PID/status, in bytes (0 if absent).
func statusKB(pid int, field string) int64 {
	return kbField(fmt.Sprintf("/proc/%d/status", pid), field)
}

// kbField reads a "Field:   123 kB" line of a /proc file, in bytes (0 if
// absent).
func kbField(file, field string) int64 {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, field) {
			if f := strings.Fields(line); len(f) >= 2 {
				v, _ := strconv.ParseInt(f[1], 10, 64)
				return v << 10
			}
		}
	}
	return 0
}

// childHWM is the largest VmHWM among pid's live children (nft and
// iptables-restore helpers), 0 when it has none. A child that still runs
// pid's own program has not reached its exec yet: Go starts a command with
// vfork (the child shares the parent's memory, so /proc shows the parent's
// VmHWM) and a fork copies the parent's high-water mark; either would count
// the proxy's memory as its helper's, so such a child is skipped.
func childHWM(pid int) int64 {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	self, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return 0
	}
	var peak int64
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, c := range strings.Fields(string(b)) {
			id, err := strconv.Atoi(c)
			if err != nil {
				continue
			}
			if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", id)); err != nil || exe == self {
				continue
			}
			peak = max(peak, statusKB(id, "VmHWM:"))
		}
	}
	return peak
}

// statusSocket is a kp's own --status-socket: kp refuses to start when
// another kp serves on the default one (/run/kp/kp.sock), which a test
// running beside the benchmark's (make test runs two packages at once)
// may.
func statusSocket(t *testing.T) string {
	t.Helper()
	// A short path: a socket's is at most 107 bytes.
	dir, err := os.MkdirTemp("", "kpbench")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "kp.sock")
}
