package nft

import (
	"sync"
	"sync/atomic"

	"github.com/kpproxy/kp/internal/nftgen"
)

// ownGens are the nftables generations kp's own large transactions made
// (those of bookGenFrom messages or more, which alone can overflow the
// monitor's socket): the
// kernel's generation counter moves by one for every transaction in the
// namespace, whoever sent it. When the monitor's socket overflows (kp's own
// full sync of a large table does), the generations it heard nothing of
// tell whether another process committed in the meantime: if every one is
// kp's, nothing was missed, and kp's record of its tables still holds,
// which spares it a read of its whole table (quadratic in the sets' sizes:
// docs/modes.md, "Known limit").
type ownGens struct {
	mu    sync.Mutex
	gens  map[uint32]bool
	order []uint32
	// inFlight counts transactions being sent whose generation is not
	// booked yet: the monitor waits for them before it judges.
	inFlight atomic.Int32
	reader   *nftgen.Reader // opened at the first use, in the conn's namespace
}

// maxOwnGens bounds the generations kept, and so the span of generations
// an overflow may have hidden and still be judged.
const maxOwnGens = 4096

func (o *ownGens) add(g uint32) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.gens == nil {
		o.gens = map[uint32]bool{}
	}
	o.gens[g] = true
	o.order = append(o.order, g)
	if len(o.order) > maxOwnGens {
		delete(o.gens, o.order[0])
		o.order = o.order[1:]
	}
}

func (o *ownGens) has(g uint32) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.gens[g]
}

// current reads the namespace's generation (0 when it cannot).
func (o *ownGens) current(nsFd int) uint32 {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.reader == nil {
		r, err := nftgen.Open(nsFd)
		if err != nil {
			return 0
		}
		o.reader = r
	}
	g, err := o.reader.Read()
	if err != nil {
		_ = o.reader.Close()
		o.reader = nil
		return 0
	}
	return g
}

// lostAreOwn reports whether every generation after last up to cur is
// kp's own: then the notifications an overflow lost between them were all
// of kp's transactions.
func lostAreOwn(last, cur uint32, own func(uint32) bool) bool {
	if last == 0 || cur < last || cur-last > maxOwnGens {
		return false
	}
	for g := last + 1; g <= cur; g++ {
		if !own(g) {
			return false
		}
	}
	return true
}
