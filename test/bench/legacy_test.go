package bench

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kpproxy/kp/test/netns"
)

// throughLegacy makes p, one of the iptables-legacy pair (legacy.go), write
// through iptables-legacy, and counts its Services there. A count that
// finds iptables-nft's tables in the namespace fails: such a proxy wrote
// through the other backend, and would otherwise only show as a cold start
// that never finishes.
func (p *proxyRun) throughLegacy() {
	prefix := "KUBE-"
	if p.name == KPIPTablesLegacy {
		prefix = "KP-"
		p.args = append(p.args, "--proxy-mode", "iptables", "--iptables-backend", "legacy")
	} else {
		p.bin = withLegacyPATH(p.t, p.bin)
	}
	ns := p.w.Node()
	p.count = func() (int, error) { return countLegacy(ns, prefix) }
	p.complete = func() error { return wroteLegacy(ns) }
}

// legacyNames are what upstream's kube-proxy runs by name
// (k8s.io/kubernetes pkg/util/iptables: cmdIPTables, cmdIPTablesSave, …),
// each with the binary upstream-iptables-legacy gets for it.
var legacyNames = map[string]string{
	"iptables": "iptables-legacy", "iptables-save": "iptables-legacy-save", "iptables-restore": "iptables-legacy-restore",
	"ip6tables": "ip6tables-legacy", "ip6tables-save": "ip6tables-legacy-save", "ip6tables-restore": "ip6tables-legacy-restore",
}

// withLegacyPATH returns a program that runs bin with a PATH whose first
// folder holds legacyNames as links to the -legacy binaries. The links keep
// the plain names, and xtables-legacy-multi picks its command by the name
// it was run as. The program is a shell script named as bin that execs it,
// so the process the harness measures (its pid, its name in the logs) is
// bin's.
func withLegacyPATH(t *testing.T, bin string) string {
	t.Helper()
	dir := t.TempDir()
	links := filepath.Join(dir, "bin")
	if err := os.Mkdir(links, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, legacy := range legacyNames {
		target, err := exec.LookPath(legacy)
		if err != nil {
			t.Fatalf("upstream-iptables-legacy: %v", err)
		}
		if err := os.Symlink(target, filepath.Join(links, name)); err != nil {
			t.Fatal(err)
		}
	}
	wrapper := filepath.Join(dir, filepath.Base(bin))
	script := fmt.Sprintf("#!/bin/sh\nPATH=%s:\"$PATH\" exec %s \"$@\"\n", shellQuote(links), shellQuote(bin))
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return wrapper
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// countLegacy counts the benchmark's Services in namespace ns's
// iptables-legacy nat table (chains under prefix), after checking that no
// iptables-nft table is there. Before anything made the legacy nat table
// (/proc/net/ip_tables_names), it is 0 without listing it: a listing would
// make the table, and wroteLegacy could no longer tell who did.
func countLegacy(ns, prefix string) (int, error) {
	if err := noIPTablesNFT(ns); err != nil {
		return 0, err
	}
	tables, err := legacyTables(ns)
	if err != nil || !slices.Contains(tables, "nat") {
		return 0, err
	}
	return countIPTables(ns, "iptables-legacy-save", prefix)
}

// wroteLegacy checks, after a cold start, that the proxy made the
// iptables-legacy nat and filter tables and no iptables-nft table.
func wroteLegacy(ns string) error {
	if err := noIPTablesNFT(ns); err != nil {
		return err
	}
	tables, err := legacyTables(ns)
	if err != nil {
		return err
	}
	for _, want := range []string{"nat", "filter"} {
		if !slices.Contains(tables, want) {
			return fmt.Errorf("no iptables-legacy %s table: /proc/net/ip_tables_names lists %q", want, tables)
		}
	}
	return nil
}

// legacyTables are the IPv4 iptables-legacy tables namespace ns has.
func legacyTables(ns string) ([]string, error) {
	out, err := netns.Exec(ns, "cat", "/proc/net/ip_tables_names")
	if err != nil {
		return nil, fmt.Errorf("list iptables-legacy tables: %w", err)
	}
	return strings.Fields(out), nil
}

// noIPTablesNFT fails when namespace ns has a table iptables-nft makes
// (ip or ip6 filter, nat, mangle, raw, security): in a legacy proxy's
// namespace, the proxy wrote through iptables-nft.
func noIPTablesNFT(ns string) error {
	out, err := netns.Exec(ns, "nft", "list", "tables")
	if err != nil {
		return err
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "table" && (f[1] == "ip" || f[1] == "ip6") &&
			slices.Contains([]string{"filter", "nat", "mangle", "raw", "security"}, f[2]) {
			return fmt.Errorf("nft lists %q: written through iptables-nft, not iptables-legacy", line)
		}
	}
	return nil
}

// flagNoLegacy is config.NoLegacy (make bench: -bench.no-legacy=10000).
var flagNoLegacy = flag.Int("bench.no-legacy", 0, "from this N on, leave out "+KPIPTablesLegacy+" and "+UpstreamIPTablesLegacy+" (0: never)")
