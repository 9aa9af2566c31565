package nft

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/test/fuzzsync"
)

// FuzzManifestToNFT follows arbitrary manifest bytes the whole way a
// folder of manifests goes (fuzzsync.Check) into the nftables backend on
// the fake kernel, which rejects what the kernel would: rules into missing
// chains, duplicate elements, deleting what is not there. After every
// change (objects removed, put back, one Service deleted and re-added) the
// incrementally synced ruleset must equal a fresh backend's after one sync
// of the same State. Seeds: the demo's manifests, testdata/manifests and
// the committed corpus (testdata/fuzz/FuzzManifestToNFT).
func FuzzManifestToNFT(f *testing.F) {
	fuzzsync.AddSeeds(f, "../manifests/demo/*.yaml", "testdata/manifests/*.yaml")
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzsync.Check(t, data, func(t *testing.T) fuzzsync.Renderer {
			fake := NewFake()
			return nftRenderer{b: newFakeBackend(t, fake), fake: fake}
		})
	})
}

type nftRenderer struct {
	b    *Backend
	fake *Fake
}

func (r nftRenderer) Sync(st *proxy.State) error { return r.b.Sync(context.Background(), st) }
func (r nftRenderer) Dump() string               { return canonical(r.fake.Dump()) }

// canonical is the fake's dump with the endpoint slots resolved. Slot
// numbers are history by design (an endpoint keeps its slot while it stays,
// a leaving one's slot is filled by the block's last: slots.go), so two
// backends that hold the same rules may number them differently. Each pick
// rule, and each service-slots element (a count and the slots' base),
// becomes the set of endpoints it picks among, and the endpoints map
// is reduced to the elements no pick rule reaches (a stale slot shows
// there).
func canonical(dump string) string {
	var out []string
	for i, table := range strings.Split(dump, "\ntable ") {
		if i > 0 {
			table = "table " + table
		}
		out = append(out, canonicalTable(table))
	}
	return strings.Join(out, "\n")
}

var (
	pickMany = regexp.MustCompile(`ct mark set numgen random mod (\d+) offset (\d+)`)
	pickOne  = regexp.MustCompile(`ct mark set 0x([0-9a-f]{8})`)
)

func canonicalTable(table string) string {
	slots := map[uint64]string{}
	lines := strings.Split(table, "\n")
	for _, l := range lines {
		elems, ok := strings.CutPrefix(strings.TrimSpace(l), "set "+mapEndpoints+" { ")
		if !ok {
			continue
		}
		for _, e := range strings.Split(strings.TrimSuffix(elems, " }"), ", ") {
			k, v, ok := strings.Cut(e, " : ")
			if !ok {
				continue
			}
			n, _ := strconv.ParseUint(strings.TrimPrefix(k, "0x"), 16, 32)
			slots[n] = v
		}
	}
	reached := map[uint64]bool{}
	pick := func(base, n uint64) string {
		var eps []string
		for s := base; s < base+n; s++ {
			eps = append(eps, slots[s])
			reached[s] = true
		}
		slices.Sort(eps)
		return "ct mark set one of {" + strings.Join(eps, ", ") + "}"
	}
	for i, l := range lines {
		if elems, ok := strings.CutPrefix(strings.TrimSpace(l), "set "+mapServiceSlots+" { "); ok {
			var out []string
			for _, e := range strings.Split(strings.TrimSuffix(elems, " }"), ", ") {
				k, v, _ := strings.Cut(e, " : ")
				slots, _ := strconv.ParseUint(strings.TrimPrefix(v, "0x"), 16, 32)
				out = append(out, k+" : "+pick(slots&maxSharedSlot, slots>>countShift))
			}
			lines[i] = "  set " + mapServiceSlots + " { " + strings.Join(out, ", ") + " }"
			continue
		}
		l = pickMany.ReplaceAllStringFunc(l, func(m string) string {
			sub := pickMany.FindStringSubmatch(m)
			n, _ := strconv.ParseUint(sub[1], 10, 32)
			base, _ := strconv.ParseUint(sub[2], 10, 32)
			return pick(base, n)
		})
		lines[i] = pickOne.ReplaceAllStringFunc(l, func(m string) string {
			base, _ := strconv.ParseUint(pickOne.FindStringSubmatch(m)[1], 16, 32)
			return pick(base, 1)
		})
	}
	var stale []string
	for s, v := range slots {
		if !reached[s] {
			stale = append(stale, v)
		}
	}
	slices.Sort(stale)
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "set "+mapEndpoints+" { ") {
			lines[i] = fmt.Sprintf("  set %s: %d elements, reached by no pick rule: %v", mapEndpoints, len(slots), stale)
		}
	}
	return strings.Join(lines, "\n")
}
