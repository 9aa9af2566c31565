package bench

import (
	"flag"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The budget of the default `make bench` (its BENCH_N and BENCH_ARGS, the
// flags' defaults for the rest) is the one the Makefile, docs/benchmark.md
// and NOTES.md state: a proxy added to the default run must move the
// stated figure with it.
func TestTheDefaultRunsBudgetIsTheOneTheDocsState(t *testing.T) {
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	variable := func(name string) string {
		m := regexp.MustCompile(`(?m)^` + name + `\s*\?=\s*(.*)$`).FindSubmatch(mk)
		if m == nil {
			t.Fatalf("the Makefile sets no %s", name)
		}
		return strings.TrimSpace(string(m[1]))
	}
	fs := flag.NewFlagSet("BENCH_ARGS", flag.ContinueOnError)
	big, bigChanges := fs.Int("bench.big", 0, ""), fs.Int("bench.big.changes", 20, "")
	bigTimeout := fs.Duration("bench.big.timeout", 10*time.Minute, "")
	nftOnly, kpOnly, noLegacy := fs.Int("bench.nft-only", 0, ""), fs.Int("bench.kp-only", 0, ""), fs.Int("bench.no-legacy", 0, "")
	if err := fs.Parse(strings.Fields(variable("BENCH_ARGS"))); err != nil {
		t.Fatalf("BENCH_ARGS: %v (a flag this test does not know: add it here)", err)
	}
	cfg := config{Proxies: HostProxies, Changes: 100, Window: 3 * time.Second, Idle: 5 * time.Second, SyncTimeout: 15 * time.Minute,
		Big: *big, BigChanges: *bigChanges, BigTimeout: *bigTimeout, NFTOnly: *nftOnly, KPOnly: *kpOnly, NoLegacy: *noLegacy,
		Rule: defaultRule, Churn: churnFlags(t), Restart: restartFlags(t), PathNs: pathFlags(t)}
	for _, s := range strings.Split(variable("BENCH_N"), ",") {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("BENCH_N: %v", err)
		}
		cfg.Ns = append(cfg.Ns, n)
	}
	total, lines := cfg.plan()
	for _, l := range lines {
		t.Log(l)
	}
	total = total.Round(time.Minute)
	stated := fmt.Sprintf("%d h %d min", int(total.Hours()), int(total.Minutes())%60)
	for file, want := range map[string]string{
		"../../Makefile":          "(" + stated + "\n# for the default run",
		"../../docs/benchmark.md": "(" + stated + " by default)",
		"NOTES.md":                "(" + stated + " for the default `make bench`",
	} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), want) {
			t.Errorf("%s does not state the default run's budget, %s (looked for %q)", file, stated, want)
		}
	}
}
