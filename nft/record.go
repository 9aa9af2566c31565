package nft

// tableRecord is kp's record of what is in one of its tables in the
// kernel: what it read there at the last full reconcile, updated by every
// diff as if its transaction succeeds (a failed one makes the next sync
// read the kernel again). It is kept between syncs for every element of
// every Service, so it holds hashes, not texts. Between syncs it holds no
// element of the endpoints map nor of the hairpin set: the slot table and
// the hairpin counts say what they hold, and a sync puts in the record
// those its diff needs (recallSlots, recallHairpins), as they are in the
// kernel, then forgets them.
type tableRecord struct {
	chains   map[string]uint64            // chain name → Chain.digest (0 = unknown: rewrite)
	sets     map[string]string            // named sets and maps → Set.digest
	elements map[string]map[string]uint64 // set → keyID → Element.digest (not for dynamic sets)
	counters map[string]bool              // named counters: kp writes none, an earlier kp's are deleted
}

func newTableRecord() *tableRecord {
	return &tableRecord{
		chains:   map[string]uint64{},
		sets:     map[string]string{},
		elements: map[string]map[string]uint64{},
		counters: map[string]bool{},
	}
}

// forgetDerived drops the elements of the sets whose contents kp derives
// from its other bookkeeping between syncs, once a sync's diff is made.
func (r *tableRecord) forgetDerived() {
	delete(r.elements, mapEndpoints)
	delete(r.elements, setHairpin)
}

// forgetWritten drops the elements of those sets that desired, just
// diffed, holds: the kernel has them as the slot table and the counts say.
// A full sync writes each of them once, so its record need not hold them
// until the sync ends; what the record still holds of those sets at its
// end was in the kernel and was not written again, for the sync to delete
// unless wanted (goneFromRecord). Why: these entries were the largest part
// of a full sync's peak heap (test/bench/NOTES.md, "Memory (issue 14)").
func (r *tableRecord) forgetWritten(desired *objects) {
	for _, set := range []string{mapEndpoints, setHairpin} {
		for k := range desired.elements[set] {
			delete(r.elements[set], k)
		}
	}
}
