package iptables

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kpproxy/kp/proxy"
)

// The stderr texts are iptables-restore v1.8.9's, captured from both flavors.
func TestParseRestoreLineReadsEveryFormat(t *testing.T) {
	for _, tc := range []struct {
		name, stderr string
		want         int
	}{
		{"bad match, nft", "iptables-nft-restore v1.8.9 (nf_tables): Couldn't load match `bogus':No such file or directory\n\nError occurred at line: 4\nTry `iptables-nft-restore -h' or 'iptables-nft-restore --help' for more information.\n", 4},
		{"bad match, legacy", "iptables-restore v1.8.9 (legacy): Couldn't load match `bogus':No such file or directory\n\nError occurred at line: 12\nTry `iptables-restore -h' or 'iptables-restore --help' for more information.\n", 12},
		{"commit refused, nft", "iptables-nft-restore: line 4 failed: No chain/target/match by that name.\n", 4},
		{"commit refused, legacy", "ip6tables-restore: line 7 failed\n", 7},
		{"no COMMIT", "iptables-nft-restore: COMMIT expected at line 4\n", 4},
		{"bad table, nft", "iptables-nft-restore v1.8.9 (nf_tables): iptables-nft-restore: line 1 table name 'nosuch' invalid\nError occurred at line: 1\n", 1},
		{"no line named", "iptables-restore: unable to initialize table 'nat'\n", 0},
		{"empty", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := parseRestoreLine(tc.stderr); got != tc.want {
				t.Errorf("parseRestoreLine = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestRestoreErrorNamesTheRefusedLine(t *testing.T) {
	in := "*filter\n:KP-A - [0:0]\n-A KP-A -m bogus -j ACCEPT\nCOMMIT\n"
	e := newRestoreError(FlavorLegacy, proxy.IPv6, []byte(in), "ip6tables-restore v1.8.9 (legacy): Couldn't load match `bogus'\n\nError occurred at line: 3\nTry `ip6tables-restore -h' or 'ip6tables-restore --help' for more information.\n")
	if e.Line != 3 || e.Text != "-A KP-A -m bogus -j ACCEPT" {
		t.Errorf("Line, Text = %d, %q", e.Line, e.Text)
	}
	want := `ip6tables-legacy-restore refused line 3 "-A KP-A -m bogus -j ACCEPT": ip6tables-restore v1.8.9 (legacy): Couldn't load match ` + "`bogus'; Error occurred at line: 3"
	if e.Error() != want {
		t.Errorf("Error() =\n %s\nwant\n %s", e.Error(), want)
	}
}

func TestMissingBinaryNamesTheDebianPackage(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	err := NewRunner(FlavorNFT, proxy.IPv4).Restore(context.Background(), nil)
	var missing *MissingBinaryError
	if !errors.As(err, &missing) || missing.Binary != "iptables-nft-restore" || !strings.Contains(err.Error(), `package "iptables"`) {
		t.Errorf("Restore with no binaries = %v, want a MissingBinaryError naming iptables-nft-restore and the package", err)
	}
	if _, err := NewRunner(FlavorLegacy, proxy.IPv6).Save(context.Background(), TableNAT, true); !errors.As(err, &missing) || missing.Binary != "ip6tables-legacy-save" {
		t.Errorf("Save with no binaries = %v, want a MissingBinaryError naming ip6tables-legacy-save", err)
	}
}

func TestARestoreKilledByASignalIsACrash(t *testing.T) {
	dir := t.TempDir()
	script := "#!/bin/sh\ncat >/dev/null\nkill -SEGV $$\n"
	if err := os.WriteFile(filepath.Join(dir, "iptables-nft-restore"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	err := NewRunner(FlavorNFT, proxy.IPv4).Restore(context.Background(), []byte("*nat\n-S\nCOMMIT\n"))
	var re *RestoreError
	if !errors.As(err, &re) || !re.Crashed || !strings.Contains(err.Error(), "segmentation fault") {
		t.Errorf("Restore of a crashing iptables-restore = %v, want a crashed RestoreError", err)
	}
}

// A bad line in the middle of a table's block leaves the whole table as it
// was, and the error names that line; checked for every flavor and family.
func TestRestoreIsAtomicPerTableAndNamesTheBadLine(t *testing.T) {
	ns := testNamespace(t)
	for _, ff := range allFlavorFamilies {
		t.Run(ff.String(), func(t *testing.T) {
			restoreIn(t, ns, ff, "*nat\n:KP-A - [0:0]\n-A KP-A -j RETURN\nCOMMIT\n")
			before := saveIn(t, ns, ff, TableNAT)
			if !strings.Contains(before, "-A KP-A -j RETURN") {
				t.Fatalf("first restore did not program KP-A:\n%s", before)
			}
			bad := "*nat\n:KP-A - [0:0]\n:KP-B - [0:0]\n-A KP-B -j RETURN\n-A KP-B -m nosuchmatch -j RETURN\n-A KP-A -j KP-B\nCOMMIT\n"
			var err error
			inNS(t, ns, func() error {
				err = NewRunner(ff.Flavor, ff.Family).Restore(context.Background(), []byte(bad))
				return nil
			})
			var re *RestoreError
			if !errors.As(err, &re) {
				t.Fatalf("Restore of a bad line = %v, want a *RestoreError", err)
			}
			if re.Line != 5 || re.Text != "-A KP-B -m nosuchmatch -j RETURN" || re.Flavor != ff.Flavor || re.Family != ff.Family {
				t.Errorf("RestoreError = %+v, want line 5 naming the nosuchmatch rule", re)
			}
			if after := saveIn(t, ns, ff, TableNAT); stripComments(after) != stripComments(before) {
				t.Errorf("the refused restore changed the table:\nbefore:\n%s\nafter:\n%s", before, after)
			}
			// A rule in a chain the input never declares fails at commit
			// time, which iptables-restore reports differently.
			inNS(t, ns, func() error {
				err = NewRunner(ff.Flavor, ff.Family).Restore(context.Background(), []byte("*nat\n-A KP-A -j RETURN\n-A KP-NONE -j RETURN\nCOMMIT\n"))
				return nil
			})
			if !errors.As(err, &re) || re.Line != 3 || re.Text != "-A KP-NONE -j RETURN" {
				t.Errorf("Restore into an undeclared chain = %v, want line 3 named", err)
			}
			if after := saveIn(t, ns, ff, TableNAT); stripComments(after) != stripComments(before) {
				t.Errorf("the refused restore changed the table:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
}

// os/exec forks the child from the calling thread, so a runner called from
// a thread locked into a namespace programs that namespace and no other.
func TestRunnerActsInTheCallingThreadsNamespace(t *testing.T) {
	a, b := testNamespace(t), testNamespace(t)
	for _, ff := range allFlavorFamilies {
		restoreIn(t, a, ff, "*filter\n:KP-ONLY-IN-A - [0:0]\nCOMMIT\n")
		if got := saveIn(t, a, ff, TableFilter); !strings.Contains(got, ":KP-ONLY-IN-A") {
			t.Errorf("%s: namespace a lacks the chain restored there:\n%s", ff, got)
		}
		if got := saveIn(t, b, ff, TableFilter); strings.Contains(got, "KP-ONLY-IN-A") {
			t.Errorf("%s: namespace b has namespace a's chain:\n%s", ff, got)
		}
	}
}

// stripComments drops iptables-save's "#" lines, which carry the date.
func stripComments(s string) string {
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(l, "#") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}
