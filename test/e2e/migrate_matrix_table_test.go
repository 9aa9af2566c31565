package e2e

import (
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
)

// The tours switch along every ordered pair of modes exactly once (the
// host's four modes in hostTours, each pair with ipvs in ipvsTours), and
// ask for the two refused pairs: a pair left out of the tours would be a
// switch no test proves.
func TestMigrationMatrixToursCoverEveryOrderedPairOnce(t *testing.T) {
	host := []mode{modeNFTables, modeIPTablesNFT, modeIPTablesLegacy, modeUserspace}
	pairs := func(tours []tour) map[string]int {
		n := map[string]int{}
		for _, tr := range tours {
			for _, h := range tr.hops() {
				n[h]++
			}
		}
		return n
	}
	want := func(modes []mode, with *mode) map[string]int {
		n := map[string]int{}
		for _, a := range modes {
			for _, b := range modes {
				if a.name == b.name || with != nil && a.name != with.name && b.name != with.name {
					continue
				}
				name := a.name + "-to-" + b.name
				if a.iptables() && b.iptables() {
					name += "-refused"
				}
				n[name] = 1
			}
		}
		return n
	}
	for _, c := range []struct {
		what  string
		tours []tour
		want  map[string]int
	}{
		{"host", hostTours, want(host, nil)},
		{"ipvs", ipvsTours, want(append(slices.Clone(host), modeIPVS), &modeIPVS)},
	} {
		got := pairs(c.tours)
		for p := range c.want {
			if got[p] != 1 {
				t.Errorf("%s tours: %s taken %d times, want once", c.what, p, got[p])
			}
		}
		for p := range got {
			if c.want[p] == 0 {
				t.Errorf("%s tours: %s is no pair of theirs", c.what, p)
			}
		}
		t.Logf("%s tours: %d pairs: %v", c.what, len(got), slices.Sorted(maps.Keys(got)))
	}
	docsMatrixIsTheTours(t, append(slices.Clone(hostTours), ipvsTours...))
	claim := vmClaim(strings.Split(vmMigrationModes, ","), vmMigrationTests, false)
	for _, tr := range ipvsTours {
		for _, h := range tr.hops() {
			if name := "TestMigrateNodeEveryOrderedPairOfModesDropsNothing/" + tr.name + "/" + h; !slices.Contains(claim.Pass, name) {
				t.Errorf("the VM's claim lacks %s", name)
			}
		}
	}
}

// docsMatrixIsTheTours checks docs/migration.md's table of every pair of modes
// (from in rows, to in columns, each cell the tour that proves the pair,
// "refused: TOUR" for a pair refused by design) against tours.
func docsMatrixIsTheTours(t *testing.T, tours []tour) {
	t.Helper()
	data, err := os.ReadFile("../../docs/migration.md")
	if err != nil {
		t.Fatal(err)
	}
	prover := map[string]string{} // hop subtest → tour
	for _, tr := range tours {
		for _, h := range tr.hops() {
			prover[h] = tr.name
		}
	}
	var cols []string
	rows := 0
	for _, line := range strings.Split(string(data), "\n") {
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if strings.HasPrefix(line, "| from \\ to |") {
			cols = cells[1:]
			continue
		}
		if cols == nil || len(cells) != len(cols)+1 || indexMode(cells[0]) < 0 {
			continue
		}
		rows++
		for i, to := range cols {
			cell, hop := strings.Trim(cells[i+1], "`"), cells[0]+"-to-"+to
			if refused, ok := strings.CutPrefix(cell, "refused: `"); ok {
				cell, hop = refused, hop+"-refused"
			}
			if want := prover[hop]; cell != want && !(cell == "—" && cells[0] == to) {
				t.Errorf("docs/migration.md: %s → %s says %q, but the tours prove it in %q (%s)", cells[0], to, cell, want, hop)
			}
		}
	}
	if rows != 5 || len(cols) != 5 {
		t.Errorf("docs/migration.md: the table of every pair of modes has %d rows and %d columns, want 5 and 5", rows, len(cols))
	}
}
