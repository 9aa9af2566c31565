package conntrack

import (
	"math/rand/v2"
	"testing"

	"github.com/kpproxy/kp/proxy"
	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy/statetest"
)

// The cleaner's count of UDP and SCTP service ports, kept from snapshot to
// snapshot through Changed, equals a count of every Service at each step of
// a random history: ports added, removed and changed in protocol, syncs
// that failed (a snapshot the cleaner never saw: a gap of generations), and
// the same State seen twice.
func TestCleanedCountFollowsTheSnapshotsChanges(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	w := statetest.New()
	var c cleanedCount
	var prev *proxy.State
	protos := []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP}
	for step := range 2000 {
		w.RandomChanges(r, func(sp *proxy.ServicePort) { sp.Protocol = protos[r.IntN(len(protos))] })
		cur := w.Next()
		if r.IntN(10) == 0 {
			continue // this sync failed: the cleaner never sees cur
		}
		prevN, curN := c.ports(prev, cur)
		if prev != nil && prevN != countCleaned(prev) {
			t.Fatalf("step %d: previous State's count %d, want %d", step, prevN, countCleaned(prev))
		}
		if curN != countCleaned(cur) {
			t.Fatalf("step %d (generation %d after %v): count %d, want %d", step, cur.Generation, generation(prev), curN, countCleaned(cur))
		}
		if r.IntN(10) == 0 {
			if _, again := c.ports(prev, cur); again != curN {
				t.Fatalf("step %d: the same State counted %d, then %d", step, curN, again)
			}
		}
		prev = cur
	}
}

func generation(st *proxy.State) uint64 {
	if st == nil {
		return 0
	}
	return st.Generation
}
