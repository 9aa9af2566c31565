package nft

// The full sync: rendered, diffed and encoded a group of Services at a
// time, and into a table that does not exist yet, in stages.

import (
	"context"
	"fmt"
	"slices"

	"github.com/kpproxy/kp/proxy"
)

// fullSyncGroup is how many Services a full sync renders before it encodes
// them: the memory of that many rendered Services, against fewer, larger
// element messages.
const fullSyncGroup = 256

// A full sync into a table that does not exist yet (a node kp never ran
// on, or one just rebooted) goes in fullSyncStages transactions instead of
// one, when it has at least fullSyncStagedFrom Services: nothing of kp's is
// in the kernel to keep whole, each stage holds whole Services (their
// chains and every element naming them), and only a stage's batch is held,
// not the whole table's (the largest single part of kp's peak). The price
// is the kernel's: each transaction adding rules that jump validates the
// whole table so far, hence few stages (measures: test/bench/NOTES.md). Packets still see one transaction: the table's base chains, the
// only objects hooked into the kernel's path, go in with the last stage, so
// until then the table is inert (a kube-proxy still serving the node keeps
// serving it) and then it is whole. A sync over an existing table stays one
// transaction. A failed stage fails the sync and leaves an inert table; the
// next one reads the kernel and reconciles in one transaction.
const (
	fullSyncStages     = 4
	fullSyncStagedFrom = 4 * fullSyncStages * fullSyncGroup
)

// stageSize is how many Services of n go in a stage: a whole number of
// groups.
func stageSize(n int) int {
	groups := (n + fullSyncGroup - 1) / fullSyncGroup
	return max(1, (groups+fullSyncStages-1)/fullSyncStages) * fullSyncGroup
}

// stager applies the stages of a full sync into a new table while the
// next stage is rendered and encoded: a stage's kernel work (its sendmsg:
// nfnetlink applies a batch in the sender's context) runs on another core
// than kp's rendering. One stage is in flight at most, so the stages reach
// the kernel in order; a Sync waits for it before its last transaction and
// before it returns.
type stager struct {
	conn Conn
	done chan error // the stage in flight; nil when none
}

// apply starts applying what tx holds and starts tx again, empty. It first
// waits for the stage before, whose error it returns.
func (s *stager) apply(tx *Transaction) error {
	if err := s.wait(); err != nil {
		return err
	}
	if err := tx.spill(); err != nil {
		return err
	}
	next := &Transaction{}
	if st, ok := s.conn.(streamer); ok {
		var err error
		if next, err = st.Stream(); err != nil {
			return fmt.Errorf("start the nftables transaction: %w", err)
		}
	}
	stage := *tx
	next.spare, stage.spare = stage.spare, nil // spilled: the encoder has them back
	*tx = *next
	s.done = make(chan error, 1)
	go func() {
		if err := s.conn.Apply(&stage); err != nil {
			s.done <- fmt.Errorf("apply a stage of a full sync into a new table: %w", err)
			return
		}
		s.done <- nil
	}()
	return nil
}

// wait waits for the stage in flight, if any, and returns its error.
func (s *stager) wait() error {
	if s.done == nil {
		return nil
	}
	err := <-s.done
	s.done = nil
	return err
}

// streamer is a Conn that can encode a transaction while it is built
// (netlinkConn; the Fake keeps every operation, for tests to read).
type streamer interface {
	Stream() (*Transaction, error)
}

// syncFull renders every service port and removes whatever else the table
// holds. It goes Service by Service, in name order: each group of
// fullSyncGroup is rendered, diffed against the record and handed to the
// transaction's stream before the next, so that a full sync never holds
// the whole rendered ruleset (it was most of kp's peak memory). The
// skeleton goes first, as service objects name its chains and sets; what nobody wants
// any more is deleted last.
func (b *Backend) syncFull(ctx context.Context, tx *Transaction, st *stager, f family, book *tableBookkeeping, s *proxy.State, skel *objects, staged bool) error {
	if book.owned != nil {
		// Over kp's own bookkeeping (the Node changed), not a table just
		// read: the record has back what it keeps none of between syncs.
		recallHairpins(book.record, book.hairpins, book.hairpins.pods())
		for _, fp := range book.owned {
			recallSlots(book.record, b.slots[f], fp)
		}
	}
	book.owned = make(map[proxy.ServicePortName]*footprint, len(s.Services))
	book.owners = newElementOwners()
	book.hairpins = newHairpins(f)
	slots := b.slots[f]
	slots.seen = map[string]bool{}
	first := skel
	if staged {
		first = withoutBaseChains(skel) // they come last (see fullSyncStages)
	}
	diff(tx, f, book.record, first, first)
	if err := tx.spill(); err != nil {
		return err
	}
	// In name order, so that slots allocated afresh (after a restart) are
	// the same for the same Services, and so that the first owner of a
	// shared element (see elementOwners) is the first to render it.
	names := make([]proxy.ServicePortName, 0, len(s.Services))
	for name := range s.Services {
		names = append(names, name)
	}
	slices.SortFunc(names, compareNames)
	stage := len(names) + 1 // no stage ends before the last group
	if staged {
		stage = stageSize(len(names))
	}
	// Services are diffed and spilled a group at a time: one message per
	// group for each set's elements, not one per Service.
	desired, v := newObjects(), newObjects()
	for i, name := range names {
		b.renderInto(v, f, slots, s.Services[name], s.Endpoints[name], s.Node)
		fp := footprintOf(name, v)
		book.own(name, fp)
		book.owners.add(fp)
		desired.mergeWithoutElements(v)
		for set, es := range v.elements {
			for k, e := range es {
				if unshared(set) || book.owners.owner(refTo(set, k)) == fp {
					desired.putElement(set, k, e)
				}
			}
		}
		for _, a := range book.hairpins.add(fp.pods) {
			desired.addElement(setHairpin, hairpinElement(a))
		}
		if (i+1)%fullSyncGroup != 0 && i != len(names)-1 {
			continue
		}
		diff(tx, f, book.record, desired, desired)
		book.record.forgetWritten(desired)
		if err := tx.spill(); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		desired.reset()
		if (i+1)%stage == 0 && i != len(names)-1 {
			if err := st.apply(tx); err != nil {
				return err
			}
		}
	}
	slots.releaseUnseen(nil, true)
	diff(tx, f, book.record, newObjects(), goneFromRecord(book.record, skel, book.owned, book.owners, book.hairpins))
	book.record.forgetDerived()
	return tx.spill()
}

// withoutBaseChains is v less its base chains (a shallow copy).
func withoutBaseChains(v *objects) *objects {
	out := &objects{chains: map[string]*Chain{}, sets: v.sets, elements: v.elements, counters: v.counters}
	for name, c := range v.chains {
		if c.Hook == nil {
			out.chains[name] = c
		}
	}
	return out
}
