package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kpproxy/kp/test/netns"
)

// upstream-iptables-legacy's kube-proxy runs each iptables command by its
// plain name: through the PATH it is given, every one is iptables-legacy.
func TestUpstreamLegacyRunsEveryIPTablesCommandOfItsPATHAsLegacy(t *testing.T) {
	netns.Require(t, "iptables-legacy", "iptables-legacy-save", "iptables-legacy-restore",
		"ip6tables-legacy", "ip6tables-legacy-save", "ip6tables-legacy-restore")
	sh := withLegacyPATH(t, "/bin/sh")
	if filepath.Base(sh) != "sh" {
		t.Errorf("the wrapper of /bin/sh is named %s: the proxy's process would not be named as its program", sh)
	}
	for name := range legacyNames {
		out, err := exec.Command(sh, "-c", name+" --version").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "(legacy)") {
			t.Errorf("%s --version through the legacy PATH: %q %v, want iptables-legacy's", name, out, err)
		}
	}
}

// A legacy proxy's count reads iptables-legacy and fails when iptables-nft
// holds tables in its namespace: a proxy of the legacy pair that wrote
// through iptables-nft fails its cold start rather than being measured as
// the other backend.
func TestLegacyCountFailsWhenTheProxyWroteThroughIPTablesNFT(t *testing.T) {
	netns.Require(t, "iptables-legacy-restore", "iptables-legacy-save", "iptables-nft-restore")
	nat := fmt.Sprintf(`*filter
:KUBE-FIREWALL - [0:0]
COMMIT
*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-AAA - [0:0]
-A PREROUTING -j KUBE-SERVICES
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-AAA
-A KUBE-SVC-AAA -p tcp -m tcp -j DNAT --to-destination 172.16.0.10:%d
COMMIT
`, podPort)
	file := filepath.Join(t.TempDir(), "rules")
	if err := os.WriteFile(file, []byte(nat), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, restore string
		want          int // -1: the count fails
	}{
		{"nothing written: 0, and no legacy table made by counting", "", 0},
		{"written through iptables-legacy: counted", "iptables-legacy-restore", 1},
		{"written through iptables-nft: the count fails", "iptables-nft-restore", -1},
	} {
		ns := netns.NewNamespace(t, "legacy")
		if c.restore != "" {
			if out, err := netns.Exec(ns, c.restore, file); err != nil {
				t.Fatalf("%s: %v: %s", c.name, err, out)
			}
		}
		got, err := countLegacy(ns, "KUBE-")
		switch {
		case c.want < 0 && err == nil:
			t.Errorf("%s: counted %d Services, want an error", c.name, got)
		case c.want >= 0 && (err != nil || got != c.want):
			t.Errorf("%s: %d Services (%v), want %d", c.name, got, err, c.want)
		}
		// After the cold start: only what iptables-legacy wrote passes.
		if err := wroteLegacy(ns); (err == nil) != (c.restore == "iptables-legacy-restore") {
			t.Errorf("%s: the check after the cold start says %v", c.name, err)
		}
	}
}

// legacySmokeWants is what the smoke's report must hold of the
// iptables-legacy pair when it measures both (TestBenchSmoke): their
// ratio's column, issue 13's targets for them, and why they churn not.
func legacySmokeWants(cfg config) []string {
	if !slices.Contains(cfg.Proxies, KPIPTablesLegacy) || !slices.Contains(cfg.Proxies, UpstreamIPTablesLegacy) {
		return nil
	}
	return []string{"| kp-iptables-legacy / upstream-iptables-legacy |",
		"## Targets (issue 13: kp-iptables-legacy against upstream-iptables-legacy", "that pair has no churn phases"}
}

// From -bench.no-legacy on the iptables-legacy pair is left out, and
// nothing else; -bench.nft-only and -bench.kp-only leave it out too.
func TestNoLegacyLeavesOutTheLegacyPairAloneFromItsN(t *testing.T) {
	cfg := config{NoLegacy: 10000, NFTOnly: 30000, KPOnly: 100000}
	for _, c := range []struct {
		proxy string
		n     int
		want  bool
	}{
		{KPIPTablesLegacy, 1000, true}, {UpstreamIPTablesLegacy, 1000, true},
		{KPIPTablesLegacy, 10000, false}, {UpstreamIPTablesLegacy, 10000, false},
		{KPIPTables, 10000, true}, {UpstreamIPTables, 10000, true}, {KPUserspace, 10000, true},
		{KPIPTablesLegacy, 30000, false}, {UpstreamNFT, 30000, true},
	} {
		if got := cfg.measures(c.proxy, c.n); got != c.want {
			t.Errorf("%s at N = %d: measured %v, want %v", c.proxy, c.n, got, c.want)
		}
	}
	if !(config{}).measures(UpstreamIPTablesLegacy, 100000) {
		t.Error("without -bench.no-legacy the pair is left out at 100,000")
	}
}
