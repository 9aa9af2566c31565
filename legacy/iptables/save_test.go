package iptables

import (
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
)

// The testdata files are real iptables-save output (iptables v1.8.9) of a
// namespace that both flavors' restore programmed with the same input.
func TestParseSaveReadsBothFlavorsRealOutput(t *testing.T) {
	wantNAT := &Dump{
		Table:    TableNAT,
		Chains:   []string{"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING", "KP-SEP-X1", "KP-SERVICES", "KP-SVC-ABC", "KUBE-SERVICES"},
		Policies: map[string]string{"PREROUTING": "ACCEPT", "INPUT": "ACCEPT", "OUTPUT": "ACCEPT", "POSTROUTING": "ACCEPT"},
		Rules: map[string][]SavedRule{
			"PREROUTING": {{Spec: `-m comment --comment "kp service portals" -j KP-SERVICES`}},
			"OUTPUT":     {{Spec: `-m comment --comment "kp service portals" -j KP-SERVICES`}},
			"KP-SEP-X1": {
				{Spec: `-s 10.244.0.5/32 -m comment --comment "a \"quoted\" word" -j MARK --set-xmark 0x4000/0x4000`},
				{Spec: `-p tcp -m tcp -j DNAT --to-destination 10.244.0.5:53`},
			},
			"KP-SERVICES":   {{Spec: `-d 10.96.0.10/32 -p tcp -m comment --comment "kube-system/kube-dns:dns-tcp cluster IP" -m tcp --dport 53 -j KP-SVC-ABC`}},
			"KP-SVC-ABC":    {{Spec: `-m comment --comment "kube-system/kube-dns:dns-tcp -> 10.244.0.5:53" -m statistic --mode random --probability 0.50000000000 -j KP-SEP-X1`}},
			"KUBE-SERVICES": {{Spec: `-m comment --comment "it\'s kube" -j RETURN`}},
		},
	}
	wantFilter := &Dump{
		Table:    TableFilter,
		Chains:   []string{"INPUT", "FORWARD", "OUTPUT", "KP-FORWARD"},
		Policies: map[string]string{"INPUT": "ACCEPT", "FORWARD": "ACCEPT", "OUTPUT": "ACCEPT"},
		Rules: map[string][]SavedRule{
			"FORWARD": {{Spec: `-m comment --comment "kp forwarding rules" -j KP-FORWARD`}},
			"KP-FORWARD": {
				{Spec: `-m conntrack --ctstate INVALID -j DROP`},
				{Spec: `-m mark --mark 0x4000/0x4000 -j ACCEPT`},
			},
		},
	}
	for _, tc := range []struct {
		file       string
		wantMangle bool
	}{
		{"nft-save.txt", false},
		{"nft-save-counters.txt", false}, // starts with the "# Warning: iptables-legacy tables present" line
		{"legacy-save.txt", true},
		{"legacy-save-counters.txt", true},
	} {
		t.Run(tc.file, func(t *testing.T) {
			data, err := os.ReadFile("testdata/" + tc.file)
			if err != nil {
				t.Fatal(err)
			}
			got, err := ParseSave(data)
			if err != nil {
				t.Fatalf("ParseSave: %v", err)
			}
			if !reflect.DeepEqual(got[TableNAT], wantNAT) {
				t.Errorf("nat:\n got %+v\nwant %+v", got[TableNAT], wantNAT)
			}
			if !reflect.DeepEqual(got[TableFilter], wantFilter) {
				t.Errorf("filter:\n got %+v\nwant %+v", got[TableFilter], wantFilter)
			}
			if m := got[TableMangle]; (m != nil) != tc.wantMangle || (m != nil && m.RuleCount() != 0) {
				t.Errorf("mangle = %+v, want present=%v and empty", m, tc.wantMangle)
			}
		})
	}
}

func TestParseSaveReadsCounters(t *testing.T) {
	in := "*nat\n:PREROUTING ACCEPT [3:180]\n:KP-X - [0:0]\n[12:3456] -A PREROUTING -j KP-X\n[18446744073709551615:0] -A KP-X -m comment --comment \"x [1:2] -A Y\" -j RETURN\nCOMMIT\n"
	got, err := ParseSave([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]SavedRule{
		"PREROUTING": {{Spec: "-j KP-X", Packets: 12, Bytes: 3456}},
		"KP-X":       {{Spec: `-m comment --comment "x [1:2] -A Y" -j RETURN`, Packets: 18446744073709551615}},
	}
	if !reflect.DeepEqual(got[TableNAT].Rules, want) {
		t.Errorf("rules = %+v, want %+v", got[TableNAT].Rules, want)
	}
}

func TestParseSaveRefusesMalformedOutput(t *testing.T) {
	for _, tc := range []struct {
		name, in, wantErr string
	}{
		{"rule before any table", "-A INPUT -j ACCEPT\n", "line 1"},
		{"rule in an undeclared chain", "*filter\n:INPUT ACCEPT [0:0]\n-A KP-X -j ACCEPT\nCOMMIT\n", "KP-X"},
		{"no COMMIT", "*filter\n:INPUT ACCEPT [0:0]\n", "no COMMIT"},
		{"table inside a table", "*filter\n*nat\nCOMMIT\n", "before table filter's COMMIT"},
		{"table twice", "*nat\nCOMMIT\n*nat\nCOMMIT\n", "twice"},
		{"chain twice", "*nat\n:A - [0:0]\n:A - [0:0]\nCOMMIT\n", "declared twice"},
		{"bad counters", "*nat\n:A - [0:0]\n[x:1] -A A -j RETURN\nCOMMIT\n", "[x:1]"},
		{"unknown line", "*nat\n-I A -j RETURN\nCOMMIT\n", "line 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseSave([]byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseSave error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestParseSaveOfNothingIsNoTables(t *testing.T) {
	got, err := ParseSave([]byte("# Warning: iptables-legacy tables present, use iptables-legacy-save to see them\n"))
	if err != nil || len(got) != 0 {
		t.Errorf("ParseSave = %v, %v; want no tables", got, err)
	}
}

// BenchmarkParseSaveOfATenThousandServiceTable parses a nat table shaped
// like kp's at 10,000 Services × 10 endpoints (110,000 chains, 330,000
// rules): a full sync and the take-over both read one.
func BenchmarkParseSaveOfATenThousandServiceTable(b *testing.B) {
	var sb strings.Builder
	sb.WriteString("*nat\n:PREROUTING ACCEPT [0:0]\n")
	for i := range 110_000 {
		fmt.Fprintf(&sb, ":KP-SEP-%016d - [0:0]\n", i)
	}
	for i := range 110_000 {
		for range 3 {
			fmt.Fprintf(&sb, "-A KP-SEP-%016d -m comment --comment \"ns/svc\" -j DNAT --to-destination 10.0.0.1:80\n", i)
		}
	}
	sb.WriteString("COMMIT\n")
	data := []byte(sb.String())
	for _, own := range []bool{false, true} {
		b.Run(fmt.Sprintf("skipOwn=%v", own), func(b *testing.B) {
			for b.Loop() {
				if _, err := parseSave(data, own); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
