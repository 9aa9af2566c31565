package nft

import (
	"errors"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/proxy"
)

// hairpinSet lists the pods in kp's ip hairpin set, checking that each
// element is "a . a".
func hairpinSet(t *testing.T, fake *Fake) []string {
	t.Helper()
	var out []string
	for _, e := range fake.Tables["ip"].Elements[setHairpin] {
		a, b, ok := strings.Cut(e.KeyText, " . ")
		if !ok || a != b {
			t.Errorf("hairpin element %q is not a pod's own pair", e.KeyText)
		}
		out = append(out, a)
	}
	slices.Sort(out)
	return out
}

// podsOf is every IPv4 pod address a world's Services have an endpoint at:
// what the hairpin set must hold.
func podsOf(w *world) []string {
	var out []string
	for _, eps := range w.endpoints {
		for _, e := range eps {
			if e.IP.Is4() && !slices.Contains(out, e.IP.String()) {
				out = append(out, e.IP.String())
			}
		}
	}
	slices.Sort(out)
	return out
}

// TestHairpinElementFollowsItsPodsServices: a pod's hairpin element is
// there while any service port has an endpoint at it, whatever the order
// Services come and go in, across partial syncs, full resyncs, restarts
// over the table and failed transactions; and a sync that leaves the set of
// pods unchanged touches none of its elements. After every step the set
// holds exactly the pods of the world's endpoints (the fake refuses to
// delete an element that is not there).
func TestHairpinElementFollowsItsPodsServices(t *testing.T) {
	a, b, c := spName("ns", "a", "http"), spName("ns", "b", ""), spName("ns", "c", "")
	aAdmin := spName("ns", "a", "admin")
	type step struct {
		do func(w *world, fake *Fake, be **Backend, now *time.Time)
		// noHairpinOps: the step's sync must not write the hairpin set.
		noHairpinOps bool
		// fails: the step's sync fails (an injected kernel error).
		fails bool
		// nodeChanged: the step's State says the Node changed (a full
		// sync over kp's own bookkeeping, without reading the kernel).
		nodeChanged bool
		// tampered: the step edits the table behind kp's back, which its
		// partial sync does not see.
		tampered bool
	}
	setup := func(w *world, _ *Fake, _ **Backend, _ *time.Time) {
		w.addService(a, "10.96.0.1", 80, 0, "10.244.0.1:80", "10.244.0.2:80")
		w.addService(b, "10.96.0.2", 80, 0, "10.244.0.1:8080", "10.244.0.3:8080")
	}
	removeA := func(w *world, _ *Fake, _ **Backend, _ *time.Time) { w.remove(a) }
	removeB := func(w *world, _ *Fake, _ **Backend, _ *time.Time) { w.remove(b) }
	restart := func(_ *world, fake *Fake, be **Backend, _ *time.Time) {
		nb, err := newBackend(testConfig(), nil, fake)
		if err != nil {
			panic(err)
		}
		*be = nb
	}
	resync := func(_ *world, _ *Fake, _ **Backend, now *time.Time) { *now = now.Add(fullSyncInterval + time.Minute) }
	// tamper deletes pod 10.244.0.1's element and adds one nobody wants,
	// behind kp's back.
	tamper := func(_ *world, fake *Fake, _ **Backend, _ *time.Time) {
		es := fake.Tables["ip"].Elements[setHairpin]
		delete(es, keyID(hairpinElement(netip.MustParseAddr("10.244.0.1")).Key, false))
		junk := hairpinElement(netip.MustParseAddr("10.244.9.9"))
		es[keyID(junk.Key, false)] = junk
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"two Services share a pod, one goes, then the other", []step{{do: setup}, {do: removeA}, {do: removeB}}},
		{"the other order", []step{{do: setup}, {do: removeB}, {do: removeA}}},
		{"both go in one sync", []step{{do: setup}, {do: func(w *world, f *Fake, be **Backend, n *time.Time) {
			removeA(w, f, be, n)
			removeB(w, f, be, n)
		}}}},
		{"a pod moves from one Service to another in one sync", []step{{do: setup}, {
			do: func(w *world, _ *Fake, _ **Backend, _ *time.Time) {
				w.setEndpoints(a, "10.244.0.1:80")
				w.setEndpoints(b, "10.244.0.1:8080", "10.244.0.2:8080", "10.244.0.3:8080")
			},
			noHairpinOps: true,
		}}},
		{"two new Services bring the same new pod in one sync", []step{{do: setup}, {do: func(w *world, _ *Fake, _ **Backend, _ *time.Time) {
			w.addService(c, "10.96.0.3", 80, 0, "10.244.0.7:80")
			w.addService(aAdmin, "10.96.0.1", 9000, 0, "10.244.0.7:9000", "10.244.0.1:9000")
		}}, {do: func(w *world, _ *Fake, _ **Backend, _ *time.Time) { w.remove(c) }, noHairpinOps: true},
			{do: func(w *world, _ *Fake, _ **Backend, _ *time.Time) { w.remove(aAdmin) }}}},
		{"an endpoint changes port, not pod", []step{{do: setup}, {
			do: func(w *world, _ *Fake, _ **Backend, _ *time.Time) {
				w.setEndpoints(a, "10.244.0.1:81", "10.244.0.2:81")
			},
			noHairpinOps: true,
		}}},
		{"two ports of a Service share pods, one port goes", []step{{do: func(w *world, _ *Fake, _ **Backend, _ *time.Time) {
			w.addService(a, "10.96.0.1", 80, 0, "10.244.0.1:80", "10.244.0.2:80")
			w.addService(aAdmin, "10.96.0.1", 9000, 0, "10.244.0.1:9000", "10.244.0.2:9000")
		}}, {do: func(w *world, _ *Fake, _ **Backend, _ *time.Time) { w.remove(aAdmin) }, noHairpinOps: true}, {do: removeA}}},
		{"a Local policy's chain repeats the Cluster chain's pods", []step{{do: func(w *world, _ *Fake, _ **Backend, _ *time.Time) {
			w.addService(c, "10.96.0.3", 80, 30003, "10.244.0.1:80", "10.244.0.4:80")
			sp := *w.services[c]
			sp.ExternalPolicyLocal = true
			w.services[c] = &sp
			eps := w.endpoints[c]
			for i := range eps {
				eps[i].NodeName = "node"
			}
			setup(w, nil, nil, nil)
		}}, {do: removeA}, {do: func(w *world, _ *Fake, _ **Backend, _ *time.Time) { w.remove(c) }}, {do: removeB}}},
		{"a Service with session affinity shares a pod", []step{{do: func(w *world, f *Fake, be **Backend, n *time.Time) {
			setup(w, f, be, n)
			w.addService(c, "10.96.0.3", 80, 0, "10.244.0.3:80", "10.244.0.5:80")
			sp := *w.services[c]
			sp.AffinityTimeout = time.Hour
			w.services[c] = &sp
		}}, {do: removeB}, {do: func(w *world, _ *Fake, _ **Backend, _ *time.Time) { w.remove(c) }}}},
		{"a Service takes session affinity and drops it", []step{{do: setup}, {do: func(w *world, _ *Fake, _ **Backend, _ *time.Time) {
			sp := *w.services[b]
			sp.AffinityTimeout = time.Hour
			w.services[b] = &sp
			w.changed[b] = struct{}{}
		}, noHairpinOps: true}, {do: removeA}, {do: func(w *world, _ *Fake, _ **Backend, _ *time.Time) {
			sp := *w.services[b]
			sp.AffinityTimeout = 0
			w.services[b] = &sp
			w.changed[b] = struct{}{}
		}, noHairpinOps: true}, {do: removeB}}},
		{"a restart over the table, then a Service goes", []step{{do: setup}, {do: restart, noHairpinOps: true}, {do: removeA}, {do: removeB}}},
		{"a restart after a Service went while kp was away", []step{{do: setup}, {do: func(w *world, f *Fake, be **Backend, n *time.Time) {
			restart(w, f, be, n)
			removeB(w, f, be, n)
		}}, {do: removeA}}},
		{"a resync repairs the set edited behind kp's back", []step{{do: setup}, {do: tamper, tampered: true}, {do: resync}, {do: removeA}, {do: removeB}}},
		{"a failed sync, then the next one reconciles", []step{{do: setup}, {do: removeA, fails: true}, {do: removeB}}},
		{"a failed sync that added a pod", []step{{do: setup}, {do: func(w *world, _ *Fake, _ **Backend, _ *time.Time) {
			w.addService(c, "10.96.0.3", 80, 0, "10.244.0.6:80", "10.244.0.1:80")
		}, fails: true}, {do: removeA}, {do: func(w *world, _ *Fake, _ **Backend, _ *time.Time) { w.remove(c) }}}},
		{"the Node changes: a full sync from kp's own bookkeeping", []step{{do: setup}, {nodeChanged: true, noHairpinOps: true},
			{do: removeA}, {do: removeB}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := NewFake()
			be := newFakeBackend(t, fake)
			now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			w := newWorld()
			for i, st := range tc.steps {
				if st.do != nil {
					st.do(w, fake, &be, &now)
				}
				be.now = func() time.Time { return now }
				s := w.state()
				s.NodeChanged = st.nodeChanged
				if st.fails {
					fake.FailNext = errors.New("injected")
					if err := be.Sync(t.Context(), s); err == nil {
						t.Fatalf("step %d: the injected failure was not reported", i)
					}
					continue
				}
				tx := captureTx(t, be, fake, s)
				if st.noHairpinOps && strings.Contains(tx, "element ip kp hairpin") {
					t.Errorf("step %d wrote the hairpin set, which keeps the same pods:\n%s", i, tx)
				}
				if got, want := hairpinSet(t, fake), podsOf(w); !st.tampered && !slices.Equal(got, want) {
					t.Errorf("step %d: hairpin set holds %v, want %v", i, got, want)
				}
			}
		})
	}
}

// TestHairpinSetIsBookedAsACountPerPod: between syncs kp keeps the hairpin
// set as a count per pod (the footprints listing it), and neither element
// references, owners nor model entries for its elements.
func TestHairpinSetIsBookedAsACountPerPod(t *testing.T) {
	a, b := spName("ns", "a", ""), spName("ns", "b", "")
	for _, tc := range []struct {
		name   string
		change func(w *world, s *proxy.State)
		want   map[string]int32
	}{
		{"after a full sync", nil, map[string]int32{"10.244.0.1": 2, "10.244.0.2": 1, "10.244.0.3": 1}},
		{"after a partial sync", func(w *world, _ *proxy.State) { w.setEndpoints(a, "10.244.0.1:80", "10.244.0.4:80") },
			map[string]int32{"10.244.0.1": 2, "10.244.0.3": 1, "10.244.0.4": 1}},
		{"after a Service went", func(w *world, _ *proxy.State) { w.remove(b) }, map[string]int32{"10.244.0.1": 1, "10.244.0.2": 1}},
		{"after a full sync over kp's own bookkeeping", func(_ *world, s *proxy.State) { s.NodeChanged = true },
			map[string]int32{"10.244.0.1": 2, "10.244.0.2": 1, "10.244.0.3": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			be := newFakeBackend(t, NewFake())
			w := newWorld()
			w.addService(a, "10.96.0.1", 80, 0, "10.244.0.1:80", "10.244.0.2:80")
			w.addService(b, "10.96.0.2", 80, 0, "10.244.0.1:8080", "10.244.0.3:8080")
			mustSync(t, be, w.state())
			if tc.change != nil {
				s := w.state()
				tc.change(w, s)
				if len(w.changed) > 0 {
					s = w.state()
				}
				mustSync(t, be, s)
			}
			book := be.tables[familyIPv4]
			if es := book.model.elements[setHairpin]; len(es) > 0 {
				t.Errorf("the model keeps %d hairpin elements between syncs", len(es))
			}
			for _, fp := range book.owned {
				for _, r := range fp.elems {
					if r.setName() == setHairpin {
						t.Errorf("%s's footprint references hairpin element %s", fp.name, keyIDText(r.key))
					}
				}
			}
			got := map[string]int32{}
			for k, n := range book.hairpins.count {
				got[netip.AddrFrom16(k).Unmap().String()] = n
			}
			if !maps.Equal(got, tc.want) {
				t.Errorf("hairpin counts %v, want %v", got, tc.want)
			}
		})
	}
}
