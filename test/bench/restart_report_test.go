package bench

import (
	"strings"
	"testing"
	"time"
)

// The restart and take-over phases' budget: the cap of rounds, a restart of
// every proxy and each take-over's three cold starts a round, each with
// the client's window; a proxy expected to run into its limit (upstream's
// iptables mode at 10,000) has neither phase and costs nothing.
func TestTheRestartPhasesBudgetLeavesOutAProxyExpectedToTimeOut(t *testing.T) {
	cfg := config{Ns: []int{10000}, Proxies: []string{KP, UpstreamNFT, UpstreamIPTables}, SyncTimeout: 15 * time.Minute,
		Big: 10000, BigTimeout: 6 * time.Minute, Rule: defaultRule,
		Restart: restartConfig{Ns: []int{10000}, Proxies: []string{KP, UpstreamNFT, UpstreamIPTables}}}
	restarts, takeOvers := cfg.restartBudget(10000)
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	if want := 12 * sec(1.41+3+14.5+3); restarts != want {
		t.Errorf("restarts %v, want %v", restarts, want)
	}
	if want := 12 * sec(14.5+3+2*(1.41+3)); takeOvers != want {
		t.Errorf("take-overs %v, want %v", takeOvers, want)
	}
	if r, to := cfg.restartBudget(1000); r != 0 || to != 0 {
		t.Errorf("at an N without the phases: %v and %v", r, to)
	}
}

// A failed connection across a kp mode's restart or take-over, a broken
// long-lived connection and an upstream rule left are each a miss;
// kubelet's chains kept are not; the restart times pair by round.
func TestTheRestartTargetsMissOnAnyFailureOrLeftover(t *testing.T) {
	ok := SwitchClient{Attempts: 500, LongLivedBytes: 1 << 16}
	failed := ok
	failed.Failed = 1
	broken := ok
	broken.LongLived = "the sink counted \"0\""
	restart := func(proxy string, round int, secs float64, c SwitchClient) Restart {
		return Restart{Mark: Mark{Run: "r", Round: round}, Proxy: proxy, N: 100, Signal: "SIGTERM", Seconds: secs, Client: c}
	}
	r := &Results{Restarts: []Restart{
		restart(KP, 1, 0.2, ok), restart(KP, 2, 0.25, ok), restart(KP, 3, 0.22, ok),
		restart(UpstreamNFT, 1, 0.8, failed), restart(UpstreamNFT, 2, 0.9, ok), restart(UpstreamNFT, 3, 0.85, ok),
		restart(KPIPTables, 1, 1.2, broken), restart(UpstreamIPTables, 1, 1.1, ok),
	}, TakeOvers: []TakeOver{
		{Mark: Mark{Run: "r", Round: 1}, Proxy: KP, From: UpstreamNFT, N: 100, Seconds: 0.3, Client: ok, ColdSeconds: 0.3},
		{Mark: Mark{Run: "r", Round: 1}, Proxy: KPIPTables, From: UpstreamIPTables, N: 100, Seconds: 1.8, Client: ok,
			Leftovers: []string{"iptables-nft-save nat chain KUBE-SERVICES"}, ColdSeconds: 1},
		{Mark: Mark{Run: "r", Round: 1}, Proxy: KP, From: UpstreamIPTables, N: 100, Seconds: 0.6, Client: failed,
			Kept: []string{"iptables-nft-save filter chain KUBE-FIREWALL"}, ColdSeconds: 0.2},
	}}
	b := &strings.Builder{}
	writeRestartTargets(b, r, 100)
	for what, want := range map[string]string{
		"no failed connection across a restart of kp |":                     "✓ met",
		"no failed connection across a restart of kp-iptables |":            "✗ missed",
		"restart: kp's first sync ≤ upstream-nft's |":                       "✓ met",
		"no rule of upstream-nft left after kp's take-over |":               "✓ met",
		"no rule of upstream-iptables left after kp-iptables's take-over |": "✗ missed",
		"no rule of upstream-iptables left after kp's take-over |":          "✓ met",
		"no failed connection across kp's take-over from upstream-iptables": "✗ missed",
	} {
		line := ""
		for _, l := range strings.Split(b.String(), "\n") {
			if strings.HasPrefix(l, "| "+what) {
				line = l
			}
		}
		if !strings.Contains(line, want) {
			t.Errorf("row %q: %q, want %s\n%s", what, line, want, b)
		}
	}
	if strings.Contains(b.String(), "across a restart of upstream") {
		t.Errorf("upstream's restarts are judged, not only shown:\n%s", b)
	}
	table := &strings.Builder{}
	writeRestarts(table, r)
	for _, want := range []string{"| 100 | upstream-nft | SIGTERM | 3 | 850.0 ms |", "| 1 of 1500 | 0 of 3 |", "**iptables-nft-save nat chain KUBE-SERVICES**",
		"(kubelet's chains kept: 1 rules and chains)"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("the tables lack %q:\n%s", want, table)
		}
	}
}

// A restart or take-over of another run is refused as every other record.
func TestTheReportRefusesARestartOrTakeOverOfAnotherRun(t *testing.T) {
	for _, change := range []func(r *Results){
		func(r *Results) {
			r.Restarts = stamp("20261125T0100Z-other", 1, Restart{Proxy: KP, N: 1000, Seconds: 1})
		},
		func(r *Results) {
			r.TakeOvers = stamp("20261125T0100Z-other", 1, TakeOver{Proxy: KP, From: UpstreamNFT, N: 1000})
		},
	} {
		r := oneRunOf("20261127T1500Z-a1", "a3816f3")
		change(r)
		if err := WriteReport(&strings.Builder{}, r); err == nil || !strings.Contains(err.Error(), `of kp at N = 1000 is of run "20261125T0100Z-other"`) {
			t.Errorf("WriteReport = %v, want the record of another run named", err)
		}
	}
}
