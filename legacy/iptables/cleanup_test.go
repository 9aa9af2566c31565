package iptables

import (
	"context"
	"log/slog"
	"reflect"
	"strings"
	"testing"

	"github.com/kpproxy/kp/proxy"
)

func TestSplitRuleSpecUndoesIptablesQuoting(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{`-A INPUT -j ACCEPT`, []string{"-A", "INPUT", "-j", "ACCEPT"}},
		{`-A X -m comment --comment "kp \"quoted\" it\'s -j KP-Y" -j KP-X`, []string{"-A", "X", "-m", "comment", "--comment", `kp "quoted" it's -j KP-Y`, "-j", "KP-X"}},
		{`-A X -m comment --comment ""  -j RETURN`, []string{"-A", "X", "-m", "comment", "--comment", "", "-j", "RETURN"}},
	} {
		got, err := splitRuleSpec(tc.in)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("splitRuleSpec(%s) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	if _, err := splitRuleSpec(`-A X --comment "open`); err == nil {
		t.Error("an unterminated quote was accepted")
	}
}

func TestJumpRuleArgsFindsOnlyJumpsToKPChains(t *testing.T) {
	for _, tc := range []struct {
		chain, spec string
		want        []string
	}{
		{"PREROUTING", `-A PREROUTING -m comment --comment "kp portals" -j KP-SERVICES`, []string{"-m", "comment", "--comment", "kp portals", "-j", "KP-SERVICES"}},
		{"KUBE-SERVICES", `-A KUBE-SERVICES -g KP-SVC-A`, []string{"-g", "KP-SVC-A"}},
		{"FORWARD", `-A FORWARD --jump KP-FORWARD`, []string{"--jump", "KP-FORWARD"}},
		{"PREROUTING", `-A PREROUTING -m comment --comment "kp: -j KP-SERVICES" -j KUBE-SERVICES`, nil},
		{"PREROUTING", `-A PREROUTING -j KUBE-SERVICES`, nil},
		{"PREROUTING", `-A OTHER -j KP-X`, nil}, // not a rule of the chain listed
		{"PREROUTING", `-P PREROUTING ACCEPT`, nil},
		{"PREROUTING", `-A PREROUTING -j KP-IPVS-SERVICES`, nil}, // the ipvs mode's
	} {
		got, ok := jumpRuleArgs(tc.spec, tc.chain, isKPChain)
		if ok != (tc.want != nil) || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("jumpRuleArgs(%s, %s) = %q, %v; want %q", tc.spec, tc.chain, got, ok, tc.want)
		}
	}
}

func TestCleanupSkipsMissingBinaries(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	removed, err := Cleanup(context.Background(), slog.New(slog.DiscardHandler))
	if err != nil || len(removed) != 4 {
		t.Fatalf("Cleanup = %v, %v; want 4 skipped backends and no error", removed, err)
	}
	for _, c := range removed {
		if !strings.Contains(c.Skipped, `package "iptables"`) {
			t.Errorf("%s/%s: Skipped = %q, want the package named", c.Flavor, c.Family, c.Skipped)
		}
	}
}

const foreignRules = `*nat
:KUBE-SERVICES - [0:0]
:FOREIGN - [0:0]
-A PREROUTING -m comment --comment "kp is only mentioned: -j KP-SERVICES" -j KUBE-SERVICES
-A KUBE-SERVICES -p tcp -m tcp --dport 80 -j FOREIGN
-A FOREIGN -j RETURN
COMMIT
*filter
:FOREIGN - [0:0]
-A FORWARD -m conntrack --ctstate INVALID -j DROP
-A FORWARD -j FOREIGN
COMMIT
*mangle
:KUBE-IPTABLES-HINT - [0:0]
COMMIT
`

// kpRules adds kp's chains and jumps among the foreign rules: before them,
// after them, from a foreign user chain, with a comment that needs quoting.
const kpRules = `*nat
:KP-SERVICES - [0:0]
:KP-SVC-A - [0:0]
:KP-SEP-A - [0:0]
:KP-POSTROUTING - [0:0]
-I PREROUTING 1 -m comment --comment "kp \"service\" it's portals" -j KP-SERVICES
-A OUTPUT -m comment --comment "kp service portals" -j KP-SERVICES
-A KUBE-SERVICES -g KP-SVC-A
-A POSTROUTING -m comment --comment "kp postrouting" -j KP-POSTROUTING
-A KP-SERVICES -p tcp -m tcp --dport 80 -j KP-SVC-A
-A KP-SVC-A -j KP-SEP-A
-A KP-SEP-A -p tcp -j DNAT --to-destination {dest}
-A KP-POSTROUTING -j MASQUERADE
COMMIT
*filter
:KP-FORWARD - [0:0]
-A FORWARD -m comment --comment "kp forwarding rules" -j KP-FORWARD
-A KP-FORWARD -m conntrack --ctstate INVALID -j DROP
COMMIT
*mangle
:KP-MARK - [0:0]
-A PREROUTING -j KP-MARK
-A KP-MARK -j MARK --set-xmark 0x4000/0x4000
COMMIT
`

// Cleanup leaves each of the four backends' iptables-save exactly as it was
// before kp's chains and jumps were added among foreign rules.
func TestCleanupRemovesOnlyKPChainsAndJumps(t *testing.T) {
	ns := testNamespace(t)
	before := map[flavorFamily]string{}
	for _, ff := range allFlavorFamilies {
		restoreIn(t, ns, ff, foreignRules)
		before[ff] = saveAllIn(t, ns, ff)
		dest := "192.0.2.1:80"
		if ff.Family == proxy.IPv6 {
			dest = "[2001:db8::1]:80"
		}
		restoreIn(t, ns, ff, strings.ReplaceAll(kpRules, "{dest}", dest))
		if got := saveAllIn(t, ns, ff); !strings.Contains(got, ":KP-SEP-A") || !strings.Contains(got, "-j KP-MARK") {
			t.Fatalf("%s: kp's rules were not added:\n%s", ff, got)
		}
	}

	var removed Removed
	inNS(t, ns, func() error {
		var err error
		removed, err = Cleanup(context.Background(), slog.New(slog.DiscardHandler))
		return err
	})
	for _, c := range removed {
		if c.Skipped != "" || c.Chains != 6 || c.Rules != 6 {
			t.Errorf("%s/%s: removed %+v, want 6 chains and 6 jump rules", c.Flavor, c.Family, c)
		}
	}
	if s := removed.String(); !strings.Contains(s, "nft/IPv4: 6 chains, 6 jump rules") || !strings.Contains(s, "legacy/IPv6: 6 chains") {
		t.Errorf("Removed.String() = %q", s)
	}
	for _, ff := range allFlavorFamilies {
		if after := saveAllIn(t, ns, ff); stripComments(after) != stripComments(before[ff]) {
			t.Errorf("%s: Cleanup did not restore the foreign rules exactly:\nbefore:\n%s\nafter:\n%s", ff, before[ff], after)
		}
	}

	inNS(t, ns, func() error {
		var err error
		removed, err = Cleanup(context.Background(), slog.New(slog.DiscardHandler))
		return err
	})
	if chains, rules := removed.Total(); chains != 0 || rules != 0 {
		t.Errorf("a second Cleanup removed %s", removed)
	}
}

// saveAllIn is ff's iptables-save of all tables in namespace ns.
func saveAllIn(t *testing.T, ns string, ff flavorFamily) string {
	t.Helper()
	var out []byte
	inNS(t, ns, func() error {
		var err error
		out, err = SaveAll(context.Background(), ff.Flavor, ff.Family)
		return err
	})
	return string(out)
}
