package proxy_test

import (
	"iter"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
)

// A PortSet kept from snapshot to snapshot through Changed holds what a test
// of every Service finds, at each step of a random history: ports added,
// removed and changed in and out of the set, syncs that failed (a State the
// set never saw: a gap of generations), and the same State seen twice.
func TestPortSetFollowsTheSnapshotsChanges(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	w := statetest.New()
	local := func(sp *proxy.ServicePort) bool { return sp.InternalPolicyLocal }
	set := proxy.NewPortSet(local)
	for step := range 2000 {
		w.RandomChanges(r, func(sp *proxy.ServicePort) { sp.InternalPolicyLocal = r.IntN(3) == 0 })
		cur := w.Next()
		if r.IntN(10) == 0 {
			continue // this sync failed: the set never sees cur
		}
		want := matching(cur, local)
		if got := sorted(set.Update(cur)); !slices.Equal(got, want) || set.Len() != len(want) {
			t.Fatalf("step %d (generation %d): set %v (len %d), want %v", step, cur.Generation, got, set.Len(), want)
		}
		if r.IntN(10) == 0 {
			if again := sorted(set.Update(cur)); !slices.Equal(again, want) {
				t.Fatalf("step %d: the same State gave %v, then %v", step, want, again)
			}
		}
	}
}

func matching(st *proxy.State, match func(*proxy.ServicePort) bool) []proxy.ServicePortName {
	var out []proxy.ServicePortName
	for _, name := range sorted(maps.Keys(st.Services)) {
		if match(st.Services[name]) {
			out = append(out, name)
		}
	}
	return out
}

func sorted(names iter.Seq[proxy.ServicePortName]) []proxy.ServicePortName {
	return slices.SortedFunc(names, func(a, b proxy.ServicePortName) int { return strings.Compare(a.String(), b.String()) })
}
