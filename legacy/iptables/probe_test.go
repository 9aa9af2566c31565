package iptables

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kpproxy/kp/proxy"
)

func TestProbeInputNamesTheFeatureOfEveryLine(t *testing.T) {
	in, features := probeInput("KP-PROBE-7", proxy.IPv6, probeRules)
	lines := strings.Split(strings.TrimSuffix(string(in), "\n"), "\n")
	if len(lines) != len(features) {
		t.Fatalf("%d lines, %d features", len(lines), len(features))
	}
	for i, l := range lines {
		if strings.Contains(l, "{") {
			t.Errorf("line %d %q keeps a placeholder", i+1, l)
		}
		if strings.Contains(l, "DNAT") && (features[i] != "the DNAT target" || !strings.Contains(l, "[2001:db8::1]:80")) {
			t.Errorf("line %d %q: feature %q, want the DNAT target to an IPv6 address", i+1, l, features[i])
		}
		if strings.Contains(l, "--reap") && !strings.Contains(l, "--name KP-PROBE-7") {
			t.Errorf("line %d %q: recent list not named after the chain", i+1, l)
		}
	}
}

// On this kernel (6.x, iptables 1.8.9) every flavor and family has all of
// kp's features, and the probe leaves no chain behind.
func TestProbeAcceptsEveryFlavorAndFamilyAndCleansUp(t *testing.T) {
	ns := testNamespace(t)
	for _, ff := range allFlavorFamilies {
		t.Run(ff.String(), func(t *testing.T) {
			// Save first: iptables-legacy-save -t creates the table.
			before := saveIn(t, ns, ff, TableNAT) + saveIn(t, ns, ff, TableFilter)
			inNS(t, ns, func() error { return Probe(context.Background(), ff.Flavor, ff.Family) })
			after := saveIn(t, ns, ff, TableNAT) + saveIn(t, ns, ff, TableFilter)
			if stripComments(after) != stripComments(before) {
				t.Errorf("Probe left rules behind:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
}

// A feature the kernel refuses is named, and the chain is removed from the
// table that had accepted its half before.
func TestProbeNamesTheRefusedFeature(t *testing.T) {
	ns := testNamespace(t)
	rules := append([]probeRule{{"a fine rule", TableNAT, "-j RETURN"}, {"the bogus match", TableFilter, "-m nosuchmatch"}}, probeRules...)
	for _, ff := range allFlavorFamilies {
		t.Run(ff.String(), func(t *testing.T) {
			before := saveIn(t, ns, ff, TableNAT) + saveIn(t, ns, ff, TableFilter)
			var err error
			inNS(t, ns, func() error {
				err = probe(context.Background(), NewRunner(ff.Flavor, ff.Family), "KP-PROBE-TEST", rules)
				return nil
			})
			var pe *ProbeError
			if !errors.As(err, &pe) || pe.Feature != "the bogus match" || pe.Flavor != ff.Flavor || pe.Family != ff.Family {
				t.Fatalf("probe = %v, want a ProbeError naming the bogus match", err)
			}
			if !strings.Contains(err.Error(), "iptables-"+string(ff.Flavor)) || !strings.Contains(err.Error(), "nosuchmatch") {
				t.Errorf("error %q names neither the flavor nor the rule", err)
			}
			after := saveIn(t, ns, ff, TableNAT) + saveIn(t, ns, ff, TableFilter)
			if stripComments(after) != stripComments(before) {
				t.Errorf("a failed probe left rules behind:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
}

func TestProbeWithoutBinariesNamesThePackage(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	err := Probe(context.Background(), FlavorLegacy, proxy.IPv4)
	if err == nil || !strings.Contains(err.Error(), "iptables-legacy-restore") || !strings.Contains(err.Error(), `package "iptables"`) {
		t.Errorf("Probe = %v, want an error naming the binary and the package", err)
	}
}

// commitRefuser is a Runner whose kernel refuses, at COMMIT as
// iptables-legacy reports it, any table block that holds a rule with
// "--missing-module".
type commitRefuser struct{ restores int }

func (c *commitRefuser) Flavor() Flavor       { return FlavorLegacy }
func (c *commitRefuser) Family() proxy.Family { return proxy.IPv4 }
func (c *commitRefuser) Save(context.Context, Table, bool) ([]byte, error) {
	return []byte("*nat\nCOMMIT\n"), nil
}

func (c *commitRefuser) Restore(_ context.Context, data []byte) error {
	c.restores++
	lines := strings.Split(string(data), "\n")
	bad := false
	for i, l := range lines {
		bad = bad || strings.Contains(l, "--missing-module")
		if l == "COMMIT" && bad {
			return &RestoreError{Flavor: FlavorLegacy, Family: proxy.IPv4, Line: i + 1, Text: l, Stderr: "iptables-restore: line N failed"}
		}
		if l == "COMMIT" {
			bad = false
		}
	}
	return nil
}

func TestProbeFindsTheFeatureARefusedCommitHides(t *testing.T) {
	rules := []probeRule{
		{"fine 1", TableNAT, "-j RETURN"},
		{"the missing module", TableNAT, "-m x --missing-module"},
		{"fine 2", TableFilter, "-j RETURN"},
	}
	r := &commitRefuser{}
	err := probe(context.Background(), r, "KP-PROBE-1", rules)
	var pe *ProbeError
	if !errors.As(err, &pe) || pe.Feature != "the missing module" {
		t.Fatalf("probe = %v, want a ProbeError naming the missing module", err)
	}
	if r.restores != 3 {
		t.Errorf("%d restores, want 3: all at once, then rule by rule up to the refused one", r.restores)
	}
}
