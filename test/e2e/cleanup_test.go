package e2e

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/kpproxy/kp/test/netns"
)

// foreignRules are another proxy's and an operator's rules, per family, as
// iptables arguments: a KUBE-SERVICES chain (upstream kube-proxy's name, so
// a cleanup that matches "KUBE" or a prefix too loosely shows), a user chain,
// and rules in the built-in PREROUTING and FORWARD chains. They match only
// documentation addresses, so they change no test traffic.
var foreignRules = map[string][][]string{
	"ip":  foreignRulesFor("192.0.2.10/32", "192.0.2.0/24"),
	"ip6": foreignRulesFor("2001:db8::10/128", "2001:db8::/32"),
}

func foreignRulesFor(host, net string) [][]string {
	return [][]string{
		{"-t", "nat", "-N", "KUBE-SERVICES"},
		{"-t", "nat", "-A", "KUBE-SERVICES", "-d", host, "-p", "tcp", "--dport", "80", "-m", "comment", "--comment", "kube-proxy's", "-j", "RETURN"},
		{"-t", "nat", "-A", "PREROUTING", "-d", net, "-j", "KUBE-SERVICES"},
		{"-t", "filter", "-N", "USER-CHAIN"},
		{"-t", "filter", "-A", "USER-CHAIN", "-s", net, "-m", "comment", "--comment", "an operator's", "-j", "DROP"},
		{"-t", "filter", "-A", "FORWARD", "-s", net, "-j", "USER-CHAIN"},
	}
}

// foreignNFT is a table of someone else's in the node's nftables ruleset.
const foreignNFT = `table inet foreign {
	chain forward {
		type filter hook forward priority 10; policy accept;
		ip saddr 192.0.2.0/24 drop comment "an operator's"
	}
}
`

var iptablesBackends = []mode{modeIPTablesNFT, modeIPTablesLegacy}

// After kp ran in any mode, `kp cleanup` removes all of kp's rules (no kp
// table; no KP- chain in either iptables backend, either family) and leaves
// everything else as it was: the foreign rules in both iptables backends
// and a foreign nftables table, all added before kp started.
func TestCleanupRemovesEveryKPRuleAndNothingElse(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		netns.Require(t, "iptables-nft", "iptables-legacy", "ip6tables-nft", "ip6tables-legacy", "nft")
		e := newEnv(t, m, 2)
		node := e.w.Node()
		for _, b := range iptablesBackends {
			for _, family := range []string{"ip", "ip6"} {
				bin := "iptables-" + b.backend
				if family == "ip6" {
					bin = "ip6tables-" + b.backend
				}
				for _, args := range foreignRules[family] {
					if out, err := e.w.Exec(node, append([]string{bin}, args...)...); err != nil {
						t.Fatalf("%s %s: %v\n%s", bin, strings.Join(args, " "), err, out)
					}
				}
			}
		}
		script := t.TempDir() + "/foreign.nft"
		if err := os.WriteFile(script, []byte(foreignNFT), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := e.w.NFT("-f", script); err != nil {
			t.Fatalf("nft -f foreign table: %v\n%s", err, out)
		}
		before := foreignState(t, e.w)

		e.write("web.yaml", web(e.w.Pods()...))
		e.startKP()
		e.answers(e.w.Client(), "tcp", webTCP)
		if out := e.rules(); !strings.Contains(out, "KP-SERVICES") && !strings.Contains(out, "table ip kp") &&
			!strings.Contains(out, "KP-IPVS-SERVICES") {
			t.Fatalf("kp wrote no rules in mode %s:\n%s", m.name, out)
		}
		if err := e.kp.Stop(); err != nil {
			t.Logf("stop kp: %v", err)
		}

		kp, err := netns.Build("./cmd/kp")
		if err != nil {
			t.Fatalf("kp does not build: %v", err)
		}
		if out, err := e.w.Exec(node, kp, "cleanup", "-v", "2"); err != nil {
			t.Fatalf("kp cleanup: %v\n%s", err, out)
		}

		if err := e.noKPRules(); err != nil {
			t.Errorf("after kp cleanup: %v", err)
		}
		for _, other := range allModes {
			if err := noKPRules(e.w, other); err != nil && other.name != m.name {
				t.Errorf("after kp cleanup (kp ran in %s): %s: %v", m.name, other.name, err)
			}
		}
		after := foreignState(t, e.w)
		for what, b := range before {
			if after[what] != b {
				t.Errorf("kp cleanup changed %s:\nbefore:\n%s\nafter:\n%s", what, b, after[what])
			}
		}
	})
}

// foreignState lists, per tool, what is not kp's in the node: each
// iptables backend's save per family, and the foreign nftables table.
// Comments and counters are dropped: they change with time and traffic.
func foreignState(t *testing.T, w *netns.World) map[string]string {
	t.Helper()
	counters := regexp.MustCompile(`\[\d+:\d+\]`)
	state := map[string]string{}
	for _, b := range iptablesBackends {
		for _, family := range []string{"ip", "ip6"} {
			out, err := w.Exec(w.Node(), b.save(family))
			if err != nil {
				t.Fatalf("%s: %v\n%s", b.save(family), err, out)
			}
			var keep []string
			for _, line := range strings.Split(out, "\n") {
				if strings.HasPrefix(line, "#") || strings.Contains(line, "KP-") {
					continue
				}
				keep = append(keep, counters.ReplaceAllString(line, "[]"))
			}
			state[b.save(family)] = strings.Join(keep, "\n")
		}
	}
	out, err := w.NFT("list", "table", "inet", "foreign")
	if err != nil {
		t.Fatalf("nft list table inet foreign: %v", err)
	}
	state["nft table inet foreign"] = out
	return state
}
