package nft

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
	v1 "k8s.io/api/core/v1"
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
func podsOf(w *statetest.World) []string {
	var out []string
	for _, eps := range w.Endpoints {
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
// holds exactly the pods of the world's endpoints (and the fake refuses to
// delete an element that is not there), and kp's model of the kernel keeps
// none of its elements (the counts say what they are).
func TestHairpinElementFollowsItsPodsServices(t *testing.T) {
	a, b, c := statetest.PortName("ns", "a", "http", v1.ProtocolTCP), statetest.PortName("ns", "b", "", v1.ProtocolTCP), statetest.PortName("ns", "c", "", v1.ProtocolTCP)
	aAdmin := statetest.PortName("ns", "a", "admin", v1.ProtocolTCP)
	setup := func(e *stepEnv) {
		e.w.AddService(a, "10.96.0.1", 80, 0, "10.244.0.1:80", "10.244.0.2:80")
		e.w.AddService(b, "10.96.0.2", 80, 0, "10.244.0.1:8080", "10.244.0.3:8080")
	}
	remove := func(names ...proxy.ServicePortName) func(e *stepEnv) {
		return func(e *stepEnv) {
			for _, n := range names {
				e.w.Remove(n)
			}
		}
	}
	// tamper deletes pod 10.244.0.1's element and adds one nobody wants,
	// behind kp's back.
	tamper := func(e *stepEnv) {
		es := e.fake.Tables["ip"].Elements[setHairpin]
		delete(es, keyID(hairpinElement(netip.MustParseAddr("10.244.0.1")).Key, false))
		junk := hairpinElement(netip.MustParseAddr("10.244.9.9"))
		es[keyID(junk.Key, false)] = junk
	}
	for _, tc := range []struct {
		name  string
		steps []syncStep
	}{
		{"two Services share a pod, one goes, then the other", []syncStep{{do: setup}, {do: remove(a)}, {do: remove(b)}}},
		{"the other order", []syncStep{{do: setup}, {do: remove(b)}, {do: remove(a)}}},
		{"both go in one sync", []syncStep{{do: setup}, {do: remove(a, b)}}},
		{"a pod moves from one Service to another in one sync", []syncStep{{do: setup}, {do: func(e *stepEnv) {
			e.w.SetEndpoints(a, "10.244.0.1:80")
			e.w.SetEndpoints(b, "10.244.0.1:8080", "10.244.0.2:8080", "10.244.0.3:8080")
		}, quiet: setHairpin}}},
		{"two new Services bring the same new pod in one sync", []syncStep{{do: setup}, {do: func(e *stepEnv) {
			e.w.AddService(c, "10.96.0.3", 80, 0, "10.244.0.7:80")
			e.w.AddService(aAdmin, "10.96.0.1", 9000, 0, "10.244.0.7:9000", "10.244.0.1:9000")
		}}, {do: remove(c), quiet: setHairpin}, {do: remove(aAdmin)}}},
		{"an endpoint changes port, not pod", []syncStep{{do: setup}, {do: func(e *stepEnv) {
			e.w.SetEndpoints(a, "10.244.0.1:81", "10.244.0.2:81")
		}, quiet: setHairpin}}},
		{"two ports of a Service share pods, one port goes", []syncStep{{do: func(e *stepEnv) {
			e.w.AddService(a, "10.96.0.1", 80, 0, "10.244.0.1:80", "10.244.0.2:80")
			e.w.AddService(aAdmin, "10.96.0.1", 9000, 0, "10.244.0.1:9000", "10.244.0.2:9000")
		}}, {do: remove(aAdmin), quiet: setHairpin}, {do: remove(a)}}},
		{"a Local policy's chain repeats the Cluster chain's pods", []syncStep{{do: func(e *stepEnv) {
			e.w.AddService(c, "10.96.0.3", 80, 30003, "10.244.0.1:80", "10.244.0.4:80")
			sp := *e.w.Services[c]
			sp.ExternalPolicyLocal = true
			e.w.Services[c] = &sp
			for i := range e.w.Endpoints[c] {
				e.w.Endpoints[c][i] = e.w.Endpoints[c][i].At("node", "")
			}
			setup(e)
		}}, {do: remove(a)}, {do: remove(c)}, {do: remove(b)}}},
		{"a Service with session affinity shares a pod", []syncStep{{do: func(e *stepEnv) {
			setup(e)
			e.w.AddService(c, "10.96.0.3", 80, 0, "10.244.0.3:80", "10.244.0.5:80")
			setAffinity(c, time.Hour)(e)
		}}, {do: remove(b)}, {do: remove(c)}}},
		{"a Service takes session affinity and drops it", []syncStep{{do: setup}, {do: setAffinity(b, time.Hour), quiet: setHairpin},
			{do: remove(a)}, {do: setAffinity(b, 0), quiet: setHairpin}, {do: remove(b)}}},
		{"a restart over the table, then a Service goes", []syncStep{{do: setup},
			{do: func(e *stepEnv) { e.restart(t) }, quiet: setHairpin}, {do: remove(a)}, {do: remove(b)}}},
		{"a restart after a Service went while kp was away", []syncStep{{do: setup}, {do: func(e *stepEnv) {
			e.restart(t)
			e.w.Remove(b)
		}}, {do: remove(a)}}},
		{"a resync repairs the set edited behind kp's back", []syncStep{{do: setup}, {do: tamper, tampered: true},
			{do: func(e *stepEnv) { e.resync() }}, {do: remove(a)}, {do: remove(b)}}},
		{"a failed sync, then the next one reconciles", []syncStep{{do: setup}, {do: remove(a), fails: true}, {do: remove(b)}}},
		{"a failed sync that added a pod", []syncStep{{do: setup}, {do: func(e *stepEnv) {
			e.w.AddService(c, "10.96.0.3", 80, 0, "10.244.0.6:80", "10.244.0.1:80")
		}, fails: true}, {do: remove(a)}, {do: remove(c)}}},
		{"the Node changes: a full sync from kp's own bookkeeping", []syncStep{{do: setup}, {nodeChanged: true, quiet: setHairpin},
			{do: remove(a)}, {do: remove(b)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runSyncSteps(t, tc.steps, func(t *testing.T, i int, e *stepEnv) {
				if got, want := hairpinSet(t, e.fake), podsOf(e.w); !slices.Equal(got, want) {
					t.Errorf("step %d: hairpin set holds %v, want %v", i, got, want)
				}
				if m := e.be.tables[familyIPv4].record.elements[setHairpin]; len(m) > 0 {
					t.Errorf("step %d: the model keeps %d hairpin elements between syncs", i, len(m))
				}
			})
		})
	}
}

// TestHairpinSetIsBookedAsACountPerPod: between syncs kp keeps the hairpin
// set as a count per pod (the footprints listing it), and neither element
// references, owners nor model entries for its elements.
func TestHairpinSetIsBookedAsACountPerPod(t *testing.T) {
	a, b := statetest.PortName("ns", "a", "", v1.ProtocolTCP), statetest.PortName("ns", "b", "", v1.ProtocolTCP)
	for _, tc := range []struct {
		name   string
		change func(w *statetest.World, s *proxy.State)
		want   map[string]int32
	}{
		{"after a full sync", nil, map[string]int32{"10.244.0.1": 2, "10.244.0.2": 1, "10.244.0.3": 1}},
		{"after a partial sync", func(w *statetest.World, _ *proxy.State) { w.SetEndpoints(a, "10.244.0.1:80", "10.244.0.4:80") },
			map[string]int32{"10.244.0.1": 2, "10.244.0.3": 1, "10.244.0.4": 1}},
		{"after a Service went", func(w *statetest.World, _ *proxy.State) { w.Remove(b) }, map[string]int32{"10.244.0.1": 1, "10.244.0.2": 1}},
		{"after a full sync over kp's own bookkeeping", func(_ *statetest.World, s *proxy.State) { s.NodeChanged = true },
			map[string]int32{"10.244.0.1": 2, "10.244.0.2": 1, "10.244.0.3": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			be := newFakeBackend(t, NewFake())
			w := newWorld()
			w.AddService(a, "10.96.0.1", 80, 0, "10.244.0.1:80", "10.244.0.2:80")
			w.AddService(b, "10.96.0.2", 80, 0, "10.244.0.1:8080", "10.244.0.3:8080")
			mustSync(t, be, w.Next())
			if tc.change != nil {
				s := w.Next()
				tc.change(w, s)
				if len(w.Changed) > 0 {
					s = w.Next()
				}
				mustSync(t, be, s)
			}
			book := be.tables[familyIPv4]
			if es := book.record.elements[setHairpin]; len(es) > 0 {
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
			for a := range book.hairpins.pods() {
				got[a.String()] = book.hairpins.count.get(a)
			}
			if !maps.Equal(got, tc.want) {
				t.Errorf("hairpin counts %v, want %v", got, tc.want)
			}
		})
	}
}

// TestHairpinCountsInBothTables: each table's counts keep its family's
// addresses whole (4 bytes in ip, 16 in ip6), add and forget them.
func TestHairpinCountsInBothTables(t *testing.T) {
	for _, tc := range []struct {
		f          family
		a, b, c    string
		wantFirsts []string
	}{
		{familyIPv4, "10.244.0.1", "10.244.0.2", "10.244.0.3", []string{"10.244.0.1", "10.244.0.2"}},
		{familyIPv6, "fd00:10:244::1", "fd00:10:244::2", "fd00:10:244::3", []string{"fd00:10:244::1", "fd00:10:244::2"}},
	} {
		t.Run(tc.f.name, func(t *testing.T) {
			addrs := func(ss ...string) podAddrs {
				var as []netip.Addr
				for _, s := range ss {
					as = append(as, netip.MustParseAddr(s))
				}
				return podAddrsOf(as)
			}
			h := newHairpins(tc.f)
			var firsts []string
			for _, a := range h.add(addrs(tc.a, tc.b)) {
				firsts = append(firsts, a.String())
			}
			slices.Sort(firsts)
			if !slices.Equal(firsts, tc.wantFirsts) {
				t.Errorf("first counted %v, want %v", firsts, tc.wantFirsts)
			}
			if got := h.add(addrs(tc.a, tc.c)); len(got) != 1 || got[0].String() != tc.c {
				t.Errorf("second add counted first %v, want [%s]", got, tc.c)
			}
			h.remove(addrs(tc.a, tc.b))
			got := map[string]int32{}
			for a := range h.pods() {
				got[a.String()] = h.count.get(a)
			}
			if want := map[string]int32{tc.a: 1, tc.c: 1}; !maps.Equal(got, want) {
				t.Errorf("counts %v, want %v", got, want)
			}
			if h.has(netip.MustParseAddr(tc.b)) || !h.has(netip.MustParseAddr(tc.a)) {
				t.Errorf("has: %s %v, %s %v", tc.b, h.has(netip.MustParseAddr(tc.b)), tc.a, h.has(netip.MustParseAddr(tc.a)))
			}
		})
	}
}
