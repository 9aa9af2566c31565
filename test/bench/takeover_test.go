package bench

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/test/netns"
)

// clearTimeout bounds the wait for a take-over to remove upstream's rules
// after kp's first sync (kp removes them once that sync succeeded:
// migrate.TakeOver).
const clearTimeout = 30 * time.Second

// takeOverTurn is one take-over: upstream proxy up's rules are in its
// namespace (its cold start again when the previous round's take-over
// removed them, then halted, as a DaemonSet switch stops it), the client
// starts, kp's mode by starts there and is timed to its first sync and to
// the namespace's first listing without any of upstream's rules; then kp is
// stopped, the namespace emptied, and kp's cold start there timed, the
// reference of the round. It says false when upstream's cold start did not
// finish (no more take-overs of it at n).
func takeOverTurn(t *testing.T, c *cluster, cfg config, n int, up *participant, by *proxyRun) (TakeOver, bool) {
	c.pointSamples(up.w, n)
	bulk := c.pointBulk(up.w.Pods()[0].IP.String())
	if count, err := up.p.count(); err != nil || count < n {
		if fs := up.p.coldStart(c, n, cfg.limit(n)(up.name)); fs.Unfinished {
			t.Logf("%s N=%d: its cold start before a take-over did not finish: no more take-overs of it", up.name, n)
			up.p.stop()
			return TakeOver{}, false
		}
		up.p.halt()
	}
	if left, _, err := upstreamRules(up.w.Node()); err != nil || len(left) == 0 {
		t.Fatalf("%s N=%d: before the take-over its rules are not listed: %v %v", up.name, n, left, err)
	}
	cl, started := beginSwitch(t, c, n, up.w, bulk, by.name+" take-over from "+up.name)
	fs := by.firstSync(c, n, cfg.limit(n)(by.name))
	to := TakeOver{Proxy: by.name, From: up.name, N: n, Seconds: fs.Seconds, CPUSeconds: fs.CPUSeconds, PeakRSS: fs.PeakRSS,
		ChildRSS: fs.ChildRSS, Unfinished: fs.Unfinished, Cleared: -1}
	for deadline := time.Now().Add(clearTimeout); ; time.Sleep(50 * time.Millisecond) {
		left, kept, err := upstreamRules(up.w.Node())
		if err != nil {
			t.Fatalf("%s N=%d take-over: list upstream's rules: %v", by.name, n, err)
		}
		to.Leftovers, to.Kept = left, kept
		if len(left) == 0 {
			to.Cleared = time.Since(started).Seconds()
			break
		}
		if time.Now().After(deadline) {
			t.Logf("%s N=%d take-over from %s: %d of upstream's rules left %v after its first sync: %v", by.name, n, up.name,
				len(left), clearTimeout, left[:min(len(left), 10)])
			break
		}
	}
	time.Sleep(switchTail)
	to.Client = cl.stop(started)
	by.stop()
	ref := by.coldStart(c, n, cfg.limit(n)(by.name))
	to.ColdSeconds, to.ColdCPUSeconds, to.ColdPeakRSS, to.ColdChildRSS = ref.Seconds, ref.CPUSeconds, ref.PeakRSS, ref.ChildRSS
	by.stop()
	return to, true
}

// kubeletChains are kubelet's chains (the list migrate/ keeps):
// upstream's iptables mode writes a copy of KUBE-FIREWALL and its jumps
// from INPUT and OUTPUT too, identical to kubelet's, and a take-over keeps
// them, since on a node kubelet owns them. Listed apart (TakeOver.Kept),
// not as leftovers.
var kubeletChains = []string{"KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT", "KUBE-MARK-DROP"}

// upstreamRules lists upstream kube-proxy's rules in namespace ns: its
// nftables tables (kube-proxy, in ip and ip6) and every KUBE-* chain, and
// jump to one, of the iptables tables of either flavor and family; those
// of kubelet's chains (kubeletChains) are kept, apart.
func upstreamRules(ns string) (left, kept []string, err error) {
	add := func(chain, what string) {
		if slices.Contains(kubeletChains, chain) {
			kept = append(kept, what)
			return
		}
		left = append(left, what)
	}
	out, err := netns.Exec(ns, "nft", "list", "tables")
	if err != nil {
		return nil, nil, fmt.Errorf("nft list tables: %v: %s", err, out)
	}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "table" && (f[1] == "ip" || f[1] == "ip6") && f[2] == "kube-proxy" {
			left = append(left, "nft table "+f[1]+" kube-proxy")
		}
	}
	for _, save := range []string{"iptables-nft-save", "ip6tables-nft-save", "iptables-legacy-save", "ip6tables-legacy-save"} {
		out, err := netns.Exec(ns, save)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %v: %s", save, err, out)
		}
		table := ""
		for _, l := range strings.Split(out, "\n") {
			switch {
			case strings.HasPrefix(l, "*"):
				table = l[1:]
			case strings.HasPrefix(l, ":KUBE-"):
				chain := strings.Fields(l[1:])[0]
				add(chain, fmt.Sprintf("%s %s chain %s", save, table, chain))
			case strings.HasPrefix(l, "-A ") && !strings.HasPrefix(l, "-A KUBE-") && strings.Contains(l, " -j KUBE-"):
				_, target, _ := strings.Cut(l, " -j ")
				add(strings.Fields(target)[0], fmt.Sprintf("%s %s rule %s", save, table, l))
			}
		}
	}
	return left, kept, nil
}

// checkRestartSmoke checks the smoke's restart and take-over phases: a
// record of each proxy and take-over, finished, with figures that make
// sense, no connection failed and no rule of upstream left.
func checkRestartSmoke(t *testing.T, cfg config, res *Results) {
	t.Helper()
	for _, n := range cfg.Restart.Ns {
		for _, p := range cfg.Restart.Proxies {
			xs := res.restartsAt(p, n)
			if len(xs) != 1 {
				t.Errorf("%s: %d restarts at N=%d, want 1", p, len(xs), n)
				continue
			}
			x := xs[0]
			switch {
			case x.Unfinished || !(x.Seconds > 0) || x.PeakRSS <= 0:
				t.Errorf("%s: restart at N=%d: unfinished or figures out of range: %+v", p, n, x)
			case x.Client.Attempts < 10 || x.Client.LongLivedBytes <= 0:
				t.Errorf("%s: restart at N=%d: the client hardly ran: %s", p, n, x.Client)
			case !x.Client.ok():
				t.Errorf("%s: restart at N=%d: %s: %v", p, n, x.Client, x.Client.Failures)
			}
		}
		for _, to := range cfg.takeOvers(n) {
			xs := res.takeOversAt(to.by, to.from, n)
			if len(xs) != 1 {
				t.Errorf("%s over %s: %d take-overs at N=%d, want 1", to.by, to.from, len(xs), n)
				continue
			}
			x := xs[0]
			switch {
			case len(x.Leftovers) > 0:
				t.Errorf("%s over %s at N=%d: upstream's rules left: %v", to.by, to.from, n, x.Leftovers)
			case x.Unfinished || !(x.Seconds > 0) || x.Cleared < 0 || !(x.ColdSeconds > 0) || x.PeakRSS <= 0:
				t.Errorf("%s over %s at N=%d: unfinished or figures out of range: %+v", to.by, to.from, n, x)
			case x.Client.Attempts < 10 || x.Client.LongLivedBytes <= 0:
				t.Errorf("%s over %s at N=%d: the client hardly ran: %s", to.by, to.from, n, x.Client)
			case !x.Client.ok():
				t.Errorf("%s over %s at N=%d: %s: %v", to.by, to.from, n, x.Client, x.Client.Failures)
			}
		}
	}
}
