package nft

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

func aps(ss ...string) []netip.AddrPort {
	var out []netip.AddrPort
	for _, s := range ss {
		out = append(out, netip.MustParseAddrPort(s))
	}
	return out
}

func TestSlotAssignmentKeepsEndpointsInTheirSlots(t *testing.T) {
	for _, tc := range []struct {
		name      string
		before    []string
		after     []string
		want      []string // slot order after
		sameBlock bool
	}{
		{"an endpoint added takes the next slot", []string{"10.0.0.1:80", "10.0.0.2:80"},
			[]string{"10.0.0.3:80", "10.0.0.2:80", "10.0.0.1:80"}, []string{"10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"}, true},
		{"a replaced endpoint takes the slot it frees", []string{"10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"},
			[]string{"10.0.0.1:80", "10.0.0.9:80", "10.0.0.3:80"}, []string{"10.0.0.1:80", "10.0.0.9:80", "10.0.0.3:80"}, true},
		{"the last endpoint fills a hole", []string{"10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"},
			[]string{"10.0.0.1:80", "10.0.0.3:80"}, []string{"10.0.0.1:80", "10.0.0.3:80"}, true},
		{"removing from the end moves nobody", []string{"10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"},
			[]string{"10.0.0.1:80", "10.0.0.2:80"}, []string{"10.0.0.1:80", "10.0.0.2:80"}, true},
		{"a block outgrown is replaced", []string{"10.0.0.1:80"},
			[]string{"10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80", "10.0.0.4:80", "10.0.0.5:80", "10.0.0.6:80", "10.0.0.7:80", "10.0.0.8:80", "10.0.0.9:80"},
			[]string{"10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80", "10.0.0.4:80", "10.0.0.5:80", "10.0.0.6:80", "10.0.0.7:80", "10.0.0.8:80", "10.0.0.9:80"}, false},
		{"no endpoint left", []string{"10.0.0.1:80", "10.0.0.2:80"}, nil, nil, true},
		{"IPv6 endpoints are kept whole", []string{"[fd00::1]:80", "[fd00:10:244::ffff]:65535"},
			[]string{"[fd00::3]:8080", "[fd00:10:244::ffff]:65535"}, []string{"[fd00::3]:8080", "[fd00:10:244::ffff]:65535"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newSlotTable()
			st.assign("other", aps("10.9.0.1:80"))
			first := *st.assign("svc", aps(tc.before...))
			got := st.assign("svc", aps(tc.after...))
			if !slices.Equal(got.eps.unpacked(), aps(tc.want...)) {
				t.Errorf("slots hold %v, want %v", got.eps.unpacked(), tc.want)
			}
			if same := got.base == first.base; same != tc.sameBlock {
				t.Errorf("block kept: %t, want %t (base %d then %d)", same, tc.sameBlock, first.base, got.base)
			}
			other := st.blocks["other"]
			if got.base < other.base+other.size && other.base < got.base+got.size {
				t.Errorf("blocks overlap: %+v and %+v", *got, *other)
			}
		})
	}
}

func TestSlotBlocksAreReusedAfterTheirChainGoes(t *testing.T) {
	st := newSlotTable()
	st.seen = map[string]bool{}
	for i := range 3 {
		st.assign(fmt.Sprint("svc", i), aps("10.0.0.1:80"))
	}
	gone := st.blocks["svc1"].base
	st.seen = map[string]bool{"svc0": true, "svc2": true}
	st.releaseUnseen(nil, true)
	if st.blocks["svc1"] != nil {
		t.Fatal("the block of a chain not seen in a full sync was kept")
	}
	if got := st.assign("svc3", aps("10.0.0.2:80")).base; got != gone {
		t.Errorf("a new chain got block %d, want the freed %d", got, gone)
	}
	if st.blocks["svc0"].base == 0 || st.blocks["svc2"].base == 0 {
		t.Error("slot 0 (a connection's mark when nothing set it) was allocated")
	}
}

// TestSlotBlocksAreAlignedToTheirSize: a shared pick sets the mark's low
// bits to the slot's index in its block (base | k), which is slot base+k
// only when the base is a multiple of the block's size. Blocks of mixed
// sizes, freed and taken again, must all be, must not overlap, and the
// gaps alignment leaves must be handed out again.
func TestSlotBlocksAreAlignedToTheirSize(t *testing.T) {
	st := newSlotTable()
	st.seen = map[string]bool{}
	rng := rand.New(rand.NewPCG(1, 2))
	eps := func(n int) []netip.AddrPort {
		out := make([]netip.AddrPort, n)
		for i := range out {
			out[i] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 80)
		}
		return out
	}
	for step := range 2000 {
		name := fmt.Sprint("p", rng.IntN(60))
		if rng.IntN(4) == 0 {
			st.release(name)
			continue
		}
		st.assign(name, eps(1+rng.IntN(40)))
		var used [][2]uint32
		for n, b := range st.blocks {
			if b.base%b.size != 0 || b.base == 0 {
				t.Fatalf("step %d: %s has block %d of size %d", step, n, b.base, b.size)
			}
			for _, u := range used {
				if b.base < u[1] && u[0] < b.base+b.size {
					t.Fatalf("step %d: %s's block %d+%d overlaps %d–%d", step, n, b.base, b.size, u[0], u[1])
				}
			}
			used = append(used, [2]uint32{b.base, b.base + b.size})
		}
	}
	// From minBlock on, a block of 8 at 8 and one of 32 at 32 leave 16…31 free as a 16.
	st = newSlotTable()
	if b := st.alloc(8); b != 8 {
		t.Fatalf("first block of 8 at %d, want 8", b)
	}
	if b := st.alloc(32); b != 32 {
		t.Fatalf("a block of 32 after it at %d, want 32", b)
	}
	if b := st.alloc(16); b != 16 {
		t.Errorf("a block of 16 at %d, want the gap at 16", b)
	}
}
