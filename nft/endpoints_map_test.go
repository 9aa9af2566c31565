package nft

import (
	"encoding/binary"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
	v1 "k8s.io/api/core/v1"
)

// servedEndpoints is what kp's ip table sends a new connection to sp's
// ClusterIP to (the Cluster policy without affinity): the endpoints map's
// elements of the slots its pick chooses from, the Service's own pick chain
// or the shared chains over the count and slots service-slots gives.
func servedEndpoints(t *testing.T, fake *Fake, sp *proxy.ServicePort) []string {
	t.Helper()
	tbl := fake.Tables["ip"]
	chain := pickChainName(serviceChainName(sp))
	var n, base uint32
	if rules, ok := tbl.Chains[chain]; ok {
		if len(rules) != 1 {
			t.Fatalf("%s has %d rules: %q", chain, len(rules), rules)
		}
		if _, err := fmt.Sscanf(rules[0], "ct mark set numgen random mod %d offset %d", &n, &base); err != nil {
			n = 1 // one endpoint: "ct mark set 0x…"
			if _, err := fmt.Sscanf(rules[0], "ct mark set %v", &base); err != nil {
				t.Fatalf("%s: %q: %v", chain, rules[0], err)
			}
		}
	} else {
		key := keyID(pad4(addrProtoPortKey(sp.ClusterIPs[0], proxy.ProtocolNumber(sp.Protocol), sp.Port)), false)
		e, ok := tbl.Elements[mapServiceSlots][key]
		if !ok {
			t.Fatalf("%s: no pick chain of its own, and no service-slots element", sp.Name)
		}
		v := binary.NativeEndian.Uint32(e.Data)
		n, base = v>>countShift, v&maxSharedSlot
	}
	var out []string
	for s := base; s < base+n; s++ {
		e, ok := tbl.Elements[mapEndpoints][keyID(slotKey(s), false)]
		if !ok {
			t.Errorf("%s picks slot %d, which the endpoints map lacks", chain, s)
			continue
		}
		out = append(out, e.DataText)
	}
	slices.Sort(out)
	return out
}

// TestEndpointsMapFollowsTheSlotTable: every Service's pick chain chooses
// among exactly its endpoints, the endpoints map holds no other element,
// and kp's model of the kernel keeps none of the map's elements between
// syncs (the slot table says what they are), across endpoint changes,
// blocks outgrown and handed to another chain, Services going, partial
// syncs, full resyncs, restarts over the table, a table edited behind kp's
// back and failed transactions. The fake refuses to delete an element that
// is not there and to add one that is, with another value.
func TestEndpointsMapFollowsTheSlotTable(t *testing.T) {
	a, b, c := statetest.PortName("ns", "a", "", v1.ProtocolTCP), statetest.PortName("ns", "b", "", v1.ProtocolTCP), statetest.PortName("ns", "c", "", v1.ProtocolTCP)
	eps := func(pod string, n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("10.244.%s.%d:80", pod, i+1))
		}
		return out
	}
	setup := func(e *stepEnv) {
		e.w.AddService(a, "10.96.0.1", 80, 0, eps("1", 3)...)
		e.w.AddService(b, "10.96.0.2", 80, 0, eps("2", 2)...)
	}
	set := func(n proxy.ServicePortName, list ...string) func(e *stepEnv) {
		return func(e *stepEnv) { e.w.SetEndpoints(n, list...) }
	}
	remove := func(n proxy.ServicePortName) func(e *stepEnv) { return func(e *stepEnv) { e.w.Remove(n) } }
	// tamper deletes a's first slot element, points b's first at another
	// address and adds an element for a slot nobody has.
	tamper := func(e *stepEnv) {
		es := e.fake.Tables["ip"].Elements[mapEndpoints]
		slots := e.be.slots[familyIPv4].blocks
		blkA, blkB := slots[pickChainName(serviceChainName(e.w.Services[a]))], slots[pickChainName(serviceChainName(e.w.Services[b]))]
		delete(es, keyID(slotKey(blkA.base), false))
		k := keyID(slotKey(blkB.base), false)
		el := es[k]
		el.Data, el.DataText = slotData(aps("10.9.9.9:1")[0]), "10.9.9.9 . 1"
		es[k] = el
		junk := Element{Key: slotKey(4000), KeyText: "0x00000fa0", Data: slotData(aps("10.9.9.9:2")[0]), DataText: "10.9.9.9 . 2"}
		es[keyID(junk.Key, false)] = junk
	}
	for _, tc := range []struct {
		name  string
		steps []syncStep
		runs  int // map order decides which changed port renders first
	}{
		{"an endpoint replaced, one removed, one added", []syncStep{{do: setup},
			{do: set(a, "10.244.1.1:80", "10.244.1.9:80", "10.244.1.3:80")},
			{do: set(a, "10.244.1.1:80", "10.244.1.3:80")},
			{do: set(a, "10.244.1.1:80", "10.244.1.3:80", "10.244.1.4:80")}}, 1},
		{"a block outgrown, then given to a new Service", []syncStep{{do: setup}, {do: set(a, eps("1", 9)...)},
			{do: func(e *stepEnv) { e.w.AddService(c, "10.96.0.3", 80, 0, eps("3", 4)...) }}}, 1},
		{"a block outgrown and handed to a new Service in one sync", []syncStep{{do: setup}, {do: func(e *stepEnv) {
			e.w.SetEndpoints(a, eps("1", 9)...)
			e.w.AddService(c, "10.96.0.3", 80, 0, eps("3", 4)...)
		}}, {do: remove(a)}, {do: remove(c)}}, 8},
		{"a Service goes, another takes its block", []syncStep{{do: setup}, {do: remove(a)},
			{do: func(e *stepEnv) { e.w.AddService(c, "10.96.0.3", 80, 0, eps("3", 2)...) }}}, 1},
		{"a Service changes but not its endpoints", []syncStep{{do: setup},
			{do: func(e *stepEnv) { e.w.Changed[a] = struct{}{} }, quiet: mapEndpoints}}, 1},
		{"a Service takes session affinity and drops it", []syncStep{{do: setup}, {do: setAffinity(a, time.Hour)},
			{do: setAffinity(a, 0)}}, 1},
		{"a restart over the table, then changes", []syncStep{{do: setup}, {do: remove(a)},
			{do: func(e *stepEnv) {
				e.restart(t) // slots are allocated afresh, in name order
				e.w.AddService(c, "10.96.0.3", 80, 0, eps("3", 2)...)
			}}, {do: set(b, "10.244.2.2:80")}}, 1},
		{"a resync repairs the map edited behind kp's back", []syncStep{{do: setup}, {do: tamper, tampered: true},
			{do: func(e *stepEnv) { e.resync() }}, {do: set(a, "10.244.1.2:80")}, {do: remove(b)}}, 1},
		{"a failed sync, then the next one reconciles", []syncStep{{do: setup}, {do: set(a, eps("1", 9)...), fails: true},
			{do: set(b, "10.244.2.5:80")}, {do: set(a, "10.244.1.1:80")}}, 1},
		{"the Node changes: a full sync from kp's own bookkeeping", []syncStep{{do: setup},
			{nodeChanged: true, quiet: mapEndpoints}, {do: set(a, "10.244.1.7:80")}}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range tc.runs {
				runSyncSteps(t, tc.steps, func(t *testing.T, i int, e *stepEnv) {
					want := 0
					for n, sp := range e.w.Services {
						if sp.AffinityTimeout > 0 || len(e.w.Endpoints[n]) == 0 {
							continue
						}
						var list []string
						for _, ep := range e.w.Endpoints[n] {
							list = append(list, fmt.Sprintf("%s . %d", ep.IP, ep.Port))
						}
						slices.Sort(list)
						want += len(list)
						if got := servedEndpoints(t, e.fake, sp); !slices.Equal(got, list) {
							t.Errorf("step %d: %s picks among %v, want %v", i, n, got, list)
						}
					}
					if got := len(e.fake.Tables["ip"].Elements[mapEndpoints]); got != want {
						t.Errorf("step %d: the endpoints map holds %d elements, want %d:\n%s", i, got, want, e.fake.Dump())
					}
					if m := e.be.tables[familyIPv4].record.elements[mapEndpoints]; len(m) > 0 {
						t.Errorf("step %d: the model keeps %d endpoints map elements between syncs", i, len(m))
					}
				})
			}
		})
	}
}
