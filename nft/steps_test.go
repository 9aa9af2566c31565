package nft

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
)

// syncStep is one step of a bookkeeping test: a change to the world (or
// to the table behind kp's back, or a restart), then a sync.
type syncStep struct {
	do func(e *stepEnv)
	// fails: the step's sync fails (an injected kernel error).
	fails bool
	// nodeChanged: the step's State says the Node changed (a full sync
	// over kp's own bookkeeping, without reading the kernel).
	nodeChanged bool
	// tampered: the step edits the table behind kp's back, which its
	// partial sync does not see: the table is not checked after it.
	tampered bool
	// quiet names a set the step's sync must not write an element of.
	quiet string
}

// stepEnv is what a step acts on.
type stepEnv struct {
	w    *statetest.World
	fake *Fake
	be   *Backend
	now  time.Time
}

// restart replaces the backend by a new one over the same table: a new kp
// process.
func (e *stepEnv) restart(t *testing.T) { e.be = newFakeBackend(t, e.fake) }

// resync makes the next sync the periodic full one, which reads the kernel.
func (e *stepEnv) resync() { e.now = e.now.Add(fullSyncInterval + time.Minute) }

// runSyncSteps runs steps, each followed by a sync, and check after every
// sync that succeeds and was not tampered with.
func runSyncSteps(t *testing.T, steps []syncStep, check func(t *testing.T, step int, e *stepEnv)) {
	t.Helper()
	e := &stepEnv{w: newWorld(), fake: NewFake(), now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	e.be = newFakeBackend(t, e.fake)
	for i, st := range steps {
		if st.do != nil {
			st.do(e)
		}
		e.be.now = func() time.Time { return e.now }
		s := e.w.Next()
		s.NodeChanged = st.nodeChanged
		if st.fails {
			e.fake.FailNext = errors.New("injected")
			if err := e.be.Sync(t.Context(), s); err == nil {
				t.Fatalf("step %d: the injected failure was not reported", i)
			}
			continue
		}
		tx := captureTx(t, e.be, e.fake, s)
		if st.quiet != "" && strings.Contains(tx, "element ip kp "+st.quiet+" ") {
			t.Errorf("step %d wrote set %s, which it leaves as it was:\n%s", i, st.quiet, tx)
		}
		if !st.tampered {
			check(t, i, e)
		}
	}
}

// setAffinity is a step giving service port n ClientIP affinity with
// timeout (0: none).
func setAffinity(n proxy.ServicePortName, timeout time.Duration) func(e *stepEnv) {
	return func(e *stepEnv) {
		sp := *e.w.Services[n]
		sp.AffinityTimeout = timeout
		e.w.Services[n] = &sp
		e.w.Changed[n] = struct{}{}
	}
}
