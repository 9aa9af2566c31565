package iptables

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
)

// lineIndex is the 0-based index of the first line of in that starts with
// prefix, -1 when none does.
func lineIndex(in, prefix string) int {
	for i, l := range strings.Split(in, "\n") {
		if strings.HasPrefix(l, prefix) {
			return i
		}
	}
	return -1
}

func TestBigIptablesNftInputsCarryTheCacheHintAfterTheBuiltinJumps(t *testing.T) {
	b, fk, _ := fakeBackend(t, testConfig())
	w := featureWorld()
	mustSync(t, b, w.Next())
	in := string(fk.Inputs[0])
	for _, table := range []string{"*nat", "*filter"} {
		block := in[strings.Index(in, table):]
		block = block[:strings.Index(block, "COMMIT")]
		hint, lastJump, firstRule := lineIndex(block, cacheHintLine), -1, lineIndex(block, "-A ")
		for i, l := range strings.Split(block, "\n") {
			if strings.HasPrefix(l, "-I ") {
				lastJump = i
			}
		}
		if hint < 0 || lastJump < 0 || !(lastJump < hint && hint < firstRule) {
			t.Errorf("%s block: jumps end at line %d, hint at %d, rules start at %d; want jumps, hint, rules:\n%s",
				table, lastJump, hint, firstRule, block)
		}
	}

	// A partial sync of one service port writes a few chains: no hint,
	// whose whole-table read would cost more than it saves.
	w.SetEndpoints(statetest.PortName("demo", "web", "http", v1.ProtocolTCP), "10.244.1.1:8080")
	mustSync(t, b, w.Next())
	if in := string(fk.Inputs[1]); lineIndex(in, cacheHintLine) >= 0 {
		t.Errorf("a partial sync of one service port has the hint:\n%s", in)
	}
}

func TestPartialSyncsOfManyChainsCarryTheCacheHint(t *testing.T) {
	b, fk, _ := fakeBackend(t, testConfig())
	w := newWorld()
	n := cacheHintMinChains / 2
	for i := range n {
		w.AddService(statetest.PortName("bulk", fmt.Sprintf("svc-%d", i), "", v1.ProtocolTCP), fmt.Sprintf("10.96.%d.%d", i>>8, i&255), 80, 0, "10.244.2.3:80", "10.244.2.4:80")
	}
	mustSync(t, b, w.Next())
	for i := range n {
		w.SetEndpoints(statetest.PortName("bulk", fmt.Sprintf("svc-%d", i), "", v1.ProtocolTCP), "10.244.2.3:80", "10.244.2.5:80")
	}
	mustSync(t, b, w.Next())
	if b.LastSyncFull() || lineIndex(string(fk.Inputs[1]), cacheHintLine) < 0 {
		t.Errorf("a partial sync rewriting %d service ports (full: %v) has no cache hint", n, b.LastSyncFull())
	}
}

func TestIptablesLegacyInputsHaveNoCacheHint(t *testing.T) {
	fk := NewFake(FlavorLegacy, 4)
	b, err := New(testConfig(), nil, WithRunners(fk), WithClock(newClock().now), WithRouteLocalnet(func() error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	mustSync(t, b, featureWorld().Next())
	if lineIndex(string(fk.Inputs[0]), cacheHintLine) >= 0 {
		t.Errorf("an iptables-legacy input has the cache hint:\n%s", fk.Inputs[0])
	}
}

func TestARefusedCacheHintIsDroppedAndTheSyncStillApplies(t *testing.T) {
	for _, crash := range []bool{false, true} {
		t.Run(fmt.Sprintf("crash=%v", crash), func(t *testing.T) { testHintDropped(t, crash) })
	}
}

func testHintDropped(t *testing.T, crash bool) {
	b, fk, _ := fakeBackend(t, testConfig())
	fk.RefuseCacheHint, fk.CrashOnCacheHint = !crash, crash
	w := featureWorld()
	if err := b.Sync(context.Background(), w.Next()); err != nil {
		t.Fatalf("sync with an iptables that refuses -S: %v", err)
	}
	if !strings.Contains(fk.Dump(TableNAT), "demo/web") {
		t.Errorf("the retried input was not applied:\n%s", fk.Dump(TableNAT))
	}
	last := string(fk.Inputs[len(fk.Inputs)-1])
	if len(fk.Inputs) != 2 || lineIndex(last, cacheHintLine) >= 0 {
		t.Errorf("%d inputs, the last with the hint: %v", len(fk.Inputs), lineIndex(last, cacheHintLine) >= 0)
	}
	// Later full syncs do not try again.
	b.books = nil
	mustSync(t, b, w.Next())
	if lineIndex(string(fk.Inputs[len(fk.Inputs)-1]), cacheHintLine) >= 0 {
		t.Error("a full sync after the refusal tried the hint again")
	}
}

func TestKeptChainsHoldNoRulesBetweenSyncsAndTheRuleCountStays(t *testing.T) {
	b, _, _ := fakeBackend(t, testConfig())
	w := featureWorld()
	mustSync(t, b, w.Next())
	natRules := func() float64 {
		return testutil.ToFloat64(b.metrics.rulesTotal.WithLabelValues("IPv4", string(TableNAT)))
	}
	before := natRules()
	for name, r := range b.books[proxy.IPv4].services {
		for _, c := range r.chains {
			if c.Rules != nil {
				t.Errorf("%s: chain %s keeps %d rules after the sync", name, c.Name, len(c.Rules))
			}
		}
	}
	// One endpoint replaced: same number of rules.
	w.SetEndpoints(statetest.PortName("demo", "web", "http", v1.ProtocolTCP), "10.244.1.1:8080", "10.244.2.9:8080")
	mustSync(t, b, w.Next())
	if got := natRules(); got != before || before == 0 {
		t.Errorf("nat rules %v after a partial sync, %v before", got, before)
	}
}

func TestEveryLineOfAnInputKnowsItsOwner(t *testing.T) {
	a, b := statetest.PortName("demo", "a", "", v1.ProtocolTCP), statetest.PortName("demo", "b", "", v1.ProtocolTCP)
	none := proxy.ServicePortName{}
	in := &input{}
	for _, l := range []struct {
		owner proxy.ServicePortName
		chain string
	}{{none, ""}, {a, "KP-SVC-A"}, {a, "KP-SVC-A"}, {a, "KP-SEP-A"}, {b, "KP-SVC-B"}, {none, "KP-SERVICES"}, {none, "KP-SERVICES"}} {
		in.line("-A "+l.chain, l.owner, l.chain)
	}
	for n, want := range map[int]lineOwner{1: {none, ""}, 2: {a, "KP-SVC-A"}, 3: {a, "KP-SVC-A"}, 4: {a, "KP-SEP-A"},
		5: {b, "KP-SVC-B"}, 6: {none, "KP-SERVICES"}, 7: {none, "KP-SERVICES"}} {
		if got := in.ownerOf(n); got != want {
			t.Errorf("line %d: owner %v, want %v", n, got, want)
		}
	}
	if len(in.runs) != 5 {
		t.Errorf("%d runs for 7 lines of 5 owners", len(in.runs))
	}
}

func TestAFullSyncReadsNoRulesOfKPsOwnChains(t *testing.T) {
	save := "*nat\n:PREROUTING ACCEPT [0:0]\n:KP-SERVICES - [0:0]\n:OTHER - [0:0]\n" +
		"-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KP-SERVICES\n" +
		"-A KP-SERVICES -d 10.96.0.1/32 -j KP-SVC-X\n-A OTHER -j RETURN\nCOMMIT\n"
	d, err := parseSave([]byte(save), true)
	if err != nil {
		t.Fatal(err)
	}
	nat := d[TableNAT]
	if !nat.HasChain("KP-SERVICES") || len(nat.Rules["KP-SERVICES"]) != 0 || len(nat.Rules["PREROUTING"]) != 1 || len(nat.Rules["OTHER"]) != 1 {
		t.Errorf("chains %v, rules %v", nat.Chains, nat.Rules)
	}
}
