package iptables

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
	v1 "k8s.io/api/core/v1"
)

// stagedBackend is fakeBackend with staging restores of at most chains
// chains, on a Fake of flavor fl.
func stagedBackend(t *testing.T, fl Flavor, chains int) (*Backend, *Fake) {
	t.Helper()
	b, _, _ := fakeBackend(t, testConfig())
	fk := NewFake(fl, proxy.IPv4)
	WithRunners(fk)(b)
	WithStaging(chains)(b)
	b.flavor = fl
	return b, fk
}

// bulkWorld is featureWorld and n more ClusterIP service ports of two
// endpoints each.
func bulkWorld(n int) *statetest.World {
	w := featureWorld()
	for i := range n {
		w.AddService(statetest.PortName("bulk", fmt.Sprintf("svc-%d", i), "", v1.ProtocolTCP), fmt.Sprintf("10.96.%d.%d", 10+i>>8, i&255), 80, 0,
			"10.244.2.3:80", "10.244.2.4:80")
	}
	return w
}

func TestColdStartOnIptablesNftStagesEveryChainInSmallRestoresThenLinksThem(t *testing.T) {
	const chunk = 16
	b, fk := stagedBackend(t, FlavorNFT, chunk)
	ref, refFake := stagedBackend(t, FlavorNFT, 0)
	w := bulkWorld(40)
	st := w.Next()
	mustSync(t, b, st)
	mustSync(t, ref, st)

	if len(fk.Inputs) < 5 {
		t.Fatalf("%d restores for 40+ service ports in chunks of %d chains; want several staging restores and the sync's own", len(fk.Inputs), chunk)
	}
	builtin := map[string]bool{}
	for _, cs := range builtinChains {
		for _, c := range cs {
			builtin[c] = true
		}
	}
	for i, raw := range fk.Inputs[:len(fk.Inputs)-1] {
		in := string(raw)
		if lineIndex(in, cacheHintLine) >= 0 {
			t.Errorf("staging restore %d has the cache hint:\n%s", i, in)
		}
		declared := 0
		for _, l := range strings.Split(in, "\n") {
			f := strings.Fields(l)
			switch {
			case strings.HasPrefix(l, ":"):
				declared++
			case len(f) > 1 && f[0] == "-A" && builtin[f[1]]:
				t.Errorf("staging restore %d writes a built-in chain: %s", i, l)
			case len(f) > 0 && (f[0] == "-I" || f[0] == "-D" || f[0] == "-X"):
				t.Errorf("staging restore %d changes what packets reach: %s", i, l)
			}
		}
		if declared > chunk {
			t.Errorf("staging restore %d declares %d chains; want at most %d", i, declared, chunk)
		}
	}
	// The sync's own restore links what was staged: the jumps from the
	// built-in chains, and nothing else.
	final := string(fk.Inputs[len(fk.Inputs)-1])
	for _, l := range strings.Split(final, "\n") {
		if strings.HasPrefix(l, ":") || strings.HasPrefix(l, "-A ") {
			t.Errorf("the sync's own restore writes a chain again, which was staged: %s", l)
		}
	}
	if !strings.Contains(final, "-j KP-SERVICES") {
		t.Errorf("the sync's own restore does not link the dispatch chains:\n%s", final)
	}
	for _, tb := range []Table{TableNAT, TableFilter} {
		if got, want := sortedDump(fk, tb), sortedDump(refFake, tb); got != want {
			t.Errorf("%s after a staged cold start differs from one restore's:\n%s\nwant:\n%s", tb, got, want)
		}
	}

	// Then syncs are as before: a partial sync stages nothing.
	n := len(fk.Inputs)
	w.SetEndpoints(statetest.PortName("demo", "web", "http", v1.ProtocolTCP), "10.244.1.9:8080")
	mustSync(t, b, w.Next())
	if len(fk.Inputs) != n+1 {
		t.Errorf("a partial sync made %d restores, want 1", len(fk.Inputs)-n)
	}
}

func TestFullSyncOfChainsTheKernelHoldsStagesNothing(t *testing.T) {
	b, fk := stagedBackend(t, FlavorNFT, 16)
	w := bulkWorld(40)
	mustSync(t, b, w.Next())
	// kp restarts: a new backend on the same kernel.
	again, _ := stagedBackend(t, FlavorNFT, 16)
	WithRunners(fk)(again)
	n := len(fk.Inputs)
	mustSync(t, again, w.Next())
	if got := len(fk.Inputs) - n; got != 1 {
		t.Errorf("a full sync over kp's own chains made %d restores; want 1 (every chain rewritten atomically)", got)
	}
	if lineIndex(string(fk.Inputs[len(fk.Inputs)-1]), cacheHintLine) < 0 {
		t.Errorf("a full sync that rewrites every chain lacks the cache hint")
	}
}

func TestIptablesLegacyNeverStages(t *testing.T) {
	b, fk := stagedBackend(t, FlavorLegacy, 16)
	mustSync(t, b, bulkWorld(40).Next())
	if len(fk.Inputs) != 1 {
		t.Errorf("iptables-legacy cold start made %d restores; want 1 (each replaces the whole table)", len(fk.Inputs))
	}
}

func TestRefusedStagingRestoreLeavesNothingReachableAndNamesTheService(t *testing.T) {
	b, fk := stagedBackend(t, FlavorNFT, 16)
	fk.Refuse = "10.96.10.30" // bulk/svc-30, in a later chunk
	w := bulkWorld(40)
	err := b.Sync(context.Background(), w.Next())
	if err == nil || !strings.Contains(err.Error(), "bulk/svc-30") {
		t.Fatalf("error %v does not name bulk/svc-30", err)
	}
	if len(fk.Inputs) < 3 {
		t.Fatalf("refused after %d restores; want earlier chunks applied first", len(fk.Inputs))
	}
	for _, tb := range []Table{TableNAT, TableFilter} {
		for _, c := range builtinChains[tb] {
			for _, r := range fk.Tables[tb].Rules[c] {
				if strings.Contains(r, "KP-") {
					t.Errorf("%s %s jumps into kp's chains after a refused cold start: %s", tb, c, r)
				}
			}
		}
	}
	// The next sync is full and completes.
	fk.Refuse = ""
	mustSync(t, b, w.Next())
	ref, refFake := stagedBackend(t, FlavorNFT, 0)
	mustSync(t, ref, w.Next())
	if got, want := sortedDump(fk, TableNAT), sortedDump(refFake, TableNAT); got != want {
		t.Errorf("nat after the retry differs from a clean cold start:\n%s\nwant:\n%s", got, want)
	}
}

// sortedDump is fk.Dump(tb) with the chains sorted by name, each chain's
// rules in order: staging creates chains in another order.
func sortedDump(fk *Fake, tb Table) string {
	lines := strings.Split(fk.Dump(tb), "\n")
	slices.SortStableFunc(lines, func(a, b string) int {
		return strings.Compare(strings.SplitN(a, ":", 2)[0], strings.SplitN(b, ":", 2)[0])
	})
	return strings.Join(lines, "\n")
}
