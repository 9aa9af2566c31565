package proxy

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/kpproxy/kp/proxy/proxytest"
)

// Every State stays as it was returned while later snapshots share its
// maps until they change them: after a random history of Services and
// slices added, changed and deleted, each State taken still holds what it
// held then.
func TestSnapshotsLeaveEarlierStatesAsTheyWere(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	tr, _ := newTestTracker(t, nil)
	type record struct {
		st        *State
		services  map[ServicePortName]*ServicePort
		endpoints map[ServicePortName][]Endpoint
	}
	var taken []record
	for range 400 {
		for range r.IntN(4) {
			i := r.IntN(12)
			name := fmt.Sprintf("svc-%d", i)
			switch r.IntN(5) {
			case 0:
				tr.OnService("ns", name, nil)
			case 1:
				tr.OnEndpointSlice("ns", name+"-a", nil)
			case 2:
				proxytest.AddService(tr, proxytest.Service("ns", name))
			default:
				ip := fmt.Sprintf("10.0.%d.%d", i, r.IntN(4)+1)
				proxytest.AddSlice(tr, proxytest.Slice("ns", name+"-a", name, []string{ip}))
			}
		}
		st := tr.Snapshot()
		taken = append(taken, record{st, maps.Clone(st.Services), cloneEndpoints(st.Endpoints)})
	}
	for _, rec := range taken {
		if !maps.Equal(rec.st.Services, rec.services) {
			t.Fatalf("generation %d: Services changed after it was returned", rec.st.Generation)
		}
		if !maps.EqualFunc(rec.st.Endpoints, rec.endpoints, slices.Equal) {
			t.Fatalf("generation %d: Endpoints changed after it was returned", rec.st.Generation)
		}
	}
}

// A snapshot in which only endpoints changed shares the previous State's
// Services map instead of copying it, and one with no change shares both.
func TestSnapshotSharesTheMapsNoChangeTouched(t *testing.T) {
	tr, _ := newTestTracker(t, nil)
	proxytest.AddService(tr, proxytest.Service("ns", "web"))
	proxytest.AddSlice(tr, proxytest.Slice("ns", "web-a", "web", []string{"10.0.0.1"}))
	first := tr.Snapshot()
	proxytest.AddSlice(tr, proxytest.Slice("ns", "web-a", "web", []string{"10.0.0.2"}))
	second := tr.Snapshot()
	if len(second.Changed) != 1 {
		t.Fatalf("changed %v, want web's port", second.Changed)
	}
	if !same(first.Services, second.Services) || same(first.Endpoints, second.Endpoints) {
		t.Errorf("after an endpoint change: Services shared %t (want true), Endpoints shared %t (want false)",
			same(first.Services, second.Services), same(first.Endpoints, second.Endpoints))
	}
	third := tr.Snapshot()
	if !same(second.Services, third.Services) || !same(second.Endpoints, third.Endpoints) {
		t.Errorf("after no change: the maps were copied")
	}
}

func same[M any](a, b M) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

func cloneEndpoints(m map[ServicePortName][]Endpoint) map[ServicePortName][]Endpoint {
	out := make(map[ServicePortName][]Endpoint, len(m))
	for k, v := range m {
		out[k] = slices.Clone(v)
	}
	return out
}
