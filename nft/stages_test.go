package nft

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestFullSyncIntoANewTableGoesInStages: a large full sync into a table
// that does not exist yet is applied in fullSyncStages transactions and
// ends with the same table as one transaction would; over an existing
// table it is one transaction.
func TestFullSyncIntoANewTableGoesInStages(t *testing.T) {
	s := scaleState(3*fullSyncGroup+10, 2) // 4 groups: a stage each
	one, staged := NewFake(), NewFake()
	b1, _ := newBackend(testConfig(), nil, one)
	b1.stagedFrom = 0
	b2, _ := newBackend(testConfig(), nil, staged)
	b2.stagedFrom = 1
	for _, b := range []*Backend{b1, b2} {
		if err := b.Sync(t.Context(), s); err != nil {
			t.Fatal(err)
		}
	}
	if one.Transactions != 1 || staged.Transactions < fullSyncStages {
		t.Errorf("transactions: %d unstaged, %d staged; want 1 and at least %d", one.Transactions, staged.Transactions, fullSyncStages)
	}
	if a, b := one.Dump(), staged.Dump(); a != b {
		t.Errorf("the staged table differs from the one-transaction table:\n%s", lineDiff(a, b))
	}
	// Packets meet the table only once it is whole: every base chain goes
	// in with the last stage.
	hooked := staged.BaseChainsAdded
	for i, n := range hooked {
		if last := i == len(hooked)-1; last != (n > 0) {
			t.Errorf("base chains added per staged transaction: %v; want them all in the last", hooked)
			break
		}
	}

	// Over the table that now exists: one transaction, which changes nothing.
	again, _ := newBackend(testConfig(), nil, staged)
	again.stagedFrom = 1
	before := staged.Transactions
	if err := again.Sync(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	if n := staged.Transactions - before; n > 1 {
		t.Errorf("a full sync over an existing table took %d transactions, want at most 1", n)
	}
}

// TestKernelFullSyncIntoANewTableGoesInStages: the same into a real table.
func TestKernelFullSyncIntoANewTableGoesInStages(t *testing.T) {
	s := scaleState(3*fullSyncGroup+10, 2)
	var listed []string
	for _, from := range []int{0, 1} {
		ns, _, b := kernelBackend(t)
		b.stagedFrom = from
		if err := b.Sync(t.Context(), s); err != nil {
			t.Fatalf("stagedFrom %d: %v", from, err)
		}
		listed = append(listed, nftIn(t, ns, "list", "table", "ip", TableName))
	}
	// The same lines; the base chains, added last, are listed last.
	if !slices.Equal(sortedLines(listed[0]), sortedLines(listed[1])) {
		t.Errorf("the staged table differs from the one-transaction table:\n%s", lineDiff(listed[0], listed[1]))
	}
	if !strings.Contains(listed[1], `comment "ns/svc777:p"`) {
		t.Errorf("the staged table lacks the last stage's Services")
	}
}

// lineDiff lists the lines of a not in b and of b not in a (at most 20).
func lineDiff(a, b string) string {
	in := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			m[l] = true
		}
		return m
	}
	ma, mb := in(a), in(b)
	var out []string
	for _, l := range strings.Split(a, "\n") {
		if !mb[l] && len(out) < 20 {
			out = append(out, "- "+l)
		}
	}
	for _, l := range strings.Split(b, "\n") {
		if !ma[l] && len(out) < 20 {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}

// TestFullSyncModelForgetsTheSlotsAndHairpinsItWrote: a full sync's model
// does not hold the endpoint-map and hairpin elements it has written (the
// slot table and the hairpin counts say what the kernel has), so it does
// not grow with the table while the sync goes on: at every staged
// transaction it holds none.
func TestFullSyncModelForgetsTheSlotsAndHairpinsItWrote(t *testing.T) {
	s := scaleState(3*fullSyncGroup+10, 2)
	watch := &modelWatch{Conn: NewFake()}
	b, _ := newBackend(testConfig(), nil, watch)
	b.stagedFrom = 1
	watch.b = b
	if err := b.Sync(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	watch.sample() // after the last transaction
	if len(watch.held) < fullSyncStages+1 {
		t.Fatalf("%d samples, want one at the start and at each of at least %d transactions", len(watch.held), fullSyncStages)
	}
	for i, n := range watch.held {
		if n != 0 {
			t.Errorf("derived elements in the model at each transaction: %v; want none (sample %d)", watch.held, i+1)
			break
		}
	}
}

// modelWatch is a Conn that records how many endpoint-map and hairpin
// elements b's models hold whenever a transaction starts: at the sync's
// start and as each stage is handed to the kernel (Stream; the stage is
// then applied while the next is rendered, so Apply cannot look).
type modelWatch struct {
	Conn
	b    *Backend
	held []int
}

func (c *modelWatch) Stream() (*Transaction, error) {
	c.sample()
	return &Transaction{}, nil
}

func (c *modelWatch) sample() {
	n := 0
	for _, book := range c.b.tables {
		n += len(book.record.elements[mapEndpoints]) + len(book.record.elements[setHairpin])
	}
	c.held = append(c.held, n)
}

// blockingConn is a Fake whose Apply waits for release, and says when it
// started: a stand-in for a stage the kernel is still applying.
type blockingConn struct {
	*Fake
	started chan int
	release chan error
	applied int
}

func (c *blockingConn) Apply(tx *Transaction) error {
	c.applied++
	c.started <- c.applied
	if err := <-c.release; err != nil {
		return err
	}
	return c.Fake.Apply(tx)
}

// TestStagerAppliesAStageWhileTheNextIsBuilt: apply returns while its stage
// is still being applied, the next apply waits for it (one stage in flight,
// in order), and a stage's error comes back from the next apply or wait.
func TestStagerAppliesAStageWhileTheNextIsBuilt(t *testing.T) {
	c := &blockingConn{Fake: NewFake(), started: make(chan int, 4), release: make(chan error)}
	st := &stager{conn: c}
	tx := &Transaction{}
	tx.addTable(familyIPv4)
	if err := st.apply(tx); err != nil {
		t.Fatal(err)
	}
	if n := <-c.started; n != 1 {
		t.Fatalf("stage %d started first", n)
	}
	if tx.Len() != 0 {
		t.Errorf("the next stage starts with %d operations, want none", tx.Len())
	}
	tx.addChain(familyIPv4, &Chain{Name: "services"}) // built while stage 1 is applied
	second := make(chan error, 1)
	go func() { second <- st.apply(tx) }()
	select {
	case n := <-c.started:
		t.Fatalf("stage %d started while stage 1 was still being applied", n)
	case err := <-second:
		t.Fatalf("the second apply returned (%v) before stage 1 was applied", err)
	case <-time.After(50 * time.Millisecond):
	}
	c.release <- nil // stage 1 done
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	if n := <-c.started; n != 2 {
		t.Fatalf("stage %d started second", n)
	}
	c.release <- errors.New("no buffer space")
	if err := st.wait(); err == nil || !strings.Contains(err.Error(), "apply a stage of a full sync into a new table: no buffer space") {
		t.Errorf("wait after a failed stage: %v", err)
	}
	if err := st.wait(); err != nil {
		t.Errorf("wait with no stage in flight: %v", err)
	}
	if c.Fake.Transactions != 1 {
		t.Errorf("the fake applied %d transactions, want stage 1 alone", c.Fake.Transactions)
	}
}
