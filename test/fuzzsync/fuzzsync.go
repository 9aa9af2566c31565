// Package fuzzsync is the property every backend's fuzz target checks:
// arbitrary manifest bytes go the whole way a folder of manifests goes (the
// strict decoder, the change tracker, snapshots) into a backend on an
// in-memory fake kernel, and every incremental sync must leave the fake
// exactly as a fresh backend leaves it after one sync of the same State.
// A backend that skipped deleting a removed Service's rules, or re-added
// them twice, or kept a stale listener, shows up as a difference.
package fuzzsync

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/source"
)

// Renderer is one backend on its fake kernel.
type Renderer interface {
	// Sync hands the backend one State.
	Sync(st *proxy.State) error
	// Dump is the fake kernel's state in a canonical form: two fakes
	// holding the same rules dump the same text, whatever order they were
	// written in.
	Dump() string
}

// NodeName is the node the tracker proxies for (manifests' Nodes and
// endpoints' nodeName use it to be local).
const NodeName = "node"

// AddSeeds adds each file the globs (relative to the test's package) match
// to f's corpus; a seed that does not decode is a broken seed, since it
// would only exercise the decoder. The committed corpus under
// testdata/fuzz/<FuzzName>/ holds the edge cases; these are the live demo
// manifests, so a new demo file is fuzzed without regenerating anything.
func AddSeeds(f *testing.F, globs ...string) {
	f.Helper()
	for _, g := range globs {
		paths, err := filepath.Glob(g)
		if err != nil {
			f.Fatal(err)
		}
		for _, p := range paths {
			data, err := os.ReadFile(p)
			if err != nil {
				f.Fatal(err)
			}
			if _, err := source.DecodeManifest(data); err != nil {
				f.Fatalf("seed %s: %v", p, err)
			}
			f.Add(data)
		}
	}
}

// Check runs the property on one input. newRenderer returns a backend on a
// fresh fake kernel; Check makes one for the incremental syncs and one per
// State it compares against.
//
// The steps, each an incremental sync compared with a fresh render of the
// same State: every object; every other object removed; them put back (the
// first State again); the first Service deleted; it re-added. Rejected
// input must be a *source.ManifestError naming the document, and a
// decoded object may never make a sync fail (the backend would be left half
// programmed and kp unready).
func Check(t *testing.T, data []byte, newRenderer func(t *testing.T) Renderer) {
	t.Helper()
	objs, err := source.DecodeManifest(data)
	if err != nil {
		var me *source.ManifestError
		if !errors.As(err, &me) {
			t.Fatalf("the decoder's error does not name the document: %v", err)
		}
		return // rejected files never reach the tracker
	}
	tr := proxy.NewChangeTracker(proxy.ChangeTrackerOptions{NodeName: NodeName})
	inc := newRenderer(t)
	step := func(what string) {
		t.Helper()
		st := tr.Snapshot()
		if err := inc.Sync(st); err != nil {
			t.Fatalf("%s: incremental sync of generation %d: %v", what, st.Generation, err)
		}
		fresh := newRenderer(t)
		if err := fresh.Sync(st); err != nil {
			t.Fatalf("%s: fresh sync of generation %d: %v", what, st.Generation, err)
		}
		if got, want := inc.Dump(), fresh.Dump(); got != want {
			t.Fatalf("%s: the incremental result differs from a fresh render of the same State\nincremental:\n%s\nfresh:\n%s",
				what, got, want)
		}
	}
	for _, o := range objs {
		Deliver(tr, o, false)
	}
	step("first sync")
	for i, o := range objs {
		if i%2 == 0 {
			Deliver(tr, o, true)
		}
	}
	step("every other object removed")
	for i, o := range objs {
		if i%2 == 0 {
			Deliver(tr, o, false)
		}
	}
	step("the removed objects re-added")
	for _, o := range objs {
		if _, ok := o.(*v1.Service); ok {
			Deliver(tr, o, true)
			step("one Service deleted")
			Deliver(tr, o, false)
			step("that Service re-added")
			break
		}
	}
}

// Deliver hands one decoded object to the sink as a source would
// (deleted: as a deletion).
func Deliver(s proxy.Sink, obj runtime.Object, deleted bool) {
	switch o := obj.(type) {
	case *v1.Service:
		if deleted {
			o = nil
		}
		s.OnService(objNamespace(obj), objName(obj), o)
	case *discovery.EndpointSlice:
		if deleted {
			o = nil
		}
		s.OnEndpointSlice(objNamespace(obj), objName(obj), o)
	case *v1.Node:
		if deleted {
			o = nil
		}
		s.OnNode(o)
	case *networkingv1.ServiceCIDR:
		if deleted {
			o = nil
		}
		s.OnServiceCIDR(objName(obj), o)
	}
}

func objName(obj runtime.Object) string {
	type named interface{ GetName() string }
	return obj.(named).GetName()
}

func objNamespace(obj runtime.Object) string {
	type namespaced interface{ GetNamespace() string }
	return obj.(namespaced).GetNamespace()
}
