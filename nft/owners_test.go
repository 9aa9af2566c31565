package nft

import (
	"testing"

	"github.com/kpproxy/kp/proxy/statetest"
	v1 "k8s.io/api/core/v1"
)

// TestElementOwnersHandTheKeyToTheNextOwnerByName: whatever order owners
// come and go in, a key belongs to the first of its owners by name, and to
// nobody once the last one is gone.
func TestElementOwnersHandTheKeyToTheNextOwnerByName(t *testing.T) {
	r := refTo(setClusterIPs, "k")
	fp := func(name string) *footprint {
		return &footprint{name: statetest.PortName("ns", name, "", v1.ProtocolTCP), elems: []elemRef{r}}
	}
	a, b, c := fp("a"), fp("b"), fp("c")
	for _, tc := range []struct {
		name   string
		add    []*footprint
		remove []*footprint
		want   *footprint
	}{
		{"one owner", []*footprint{b}, nil, b},
		{"added after", []*footprint{a, c, b}, nil, a},
		{"added before", []*footprint{c, b, a}, nil, a},
		{"first goes", []*footprint{c, a, b}, []*footprint{a}, b},
		{"first two go", []*footprint{b, a, c}, []*footprint{a, b}, c},
		{"another goes", []*footprint{a, b, c}, []*footprint{b}, a},
		{"all go", []*footprint{c, b, a}, []*footprint{b, a, c}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := newElementOwners()
			for _, x := range tc.add {
				o.add(x)
			}
			for _, x := range tc.remove {
				o.remove(x)
			}
			if got := o.owner(r); got != tc.want {
				t.Errorf("owner = %v, want %v", got, tc.want)
			}
			if tc.want == nil && (len(o.first) > 0 || len(o.more) > 0) {
				t.Errorf("owners left behind: %v %v", o.first, o.more)
			}
		})
	}
}

// TestElementOwnersAreExactWhenKeysCollide: the index is by a hash of the
// key; keys sharing a hash keep their own owners.
func TestElementOwnersAreExactWhenKeysCollide(t *testing.T) {
	o := newElementOwners()
	o.hashOf = func(elemRef) uint64 { return 7 } // every key collides
	r1, r2, r3 := refTo(setClusterIPs, "k1"), refTo(setHairpin, "k2"), refTo(setClusterIPs, "k3")
	a := &footprint{name: statetest.PortName("ns", "a", "", v1.ProtocolTCP), elems: []elemRef{r2}}
	b := &footprint{name: statetest.PortName("ns", "b", "", v1.ProtocolTCP), elems: []elemRef{r1, r2}}
	c := &footprint{name: statetest.PortName("ns", "c", "", v1.ProtocolTCP), elems: []elemRef{r1}}
	for _, fp := range []*footprint{c, b, a} {
		o.add(fp)
	}
	check := func(step string, want map[elemRef]*footprint) {
		t.Helper()
		for _, r := range []elemRef{r1, r2, r3} {
			if got := o.owner(r); got != want[r] {
				t.Errorf("%s: owner(%v) = %v, want %v", step, r, got, want[r])
			}
		}
	}
	check("all added", map[elemRef]*footprint{r1: b, r2: a})
	o.remove(b)
	check("b removed", map[elemRef]*footprint{r1: c, r2: a})
	o.remove(a)
	o.remove(c)
	check("all removed", nil)
	if len(o.first)+len(o.more) > 0 {
		t.Errorf("owners left behind: %v %v", o.first, o.more)
	}
}
