package nft

import (
	"context"
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

// FuzzManifestToNFT follows arbitrary manifest bytes the whole way a
// folder of manifests goes: the strict decoder, the change tracker, a
// snapshot, the nftables backend on the fake kernel (which rejects what the
// kernel would: rules into missing chains, duplicate elements, deleting
// what is not there). Nothing may panic, a decoded object may never make a
// sync fail, and after objects are removed the incremental result must equal
// a fresh full render of the same State.
func FuzzManifestToNFT(f *testing.F) {
	seeds, _ := filepath.Glob("../manifests/demo/*.yaml")
	more, _ := filepath.Glob("testdata/manifests/*.yaml")
	for _, p := range append(seeds, more...) {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		// A seed that does not decode would only exercise the decoder.
		if _, err := source.DecodeManifest(data); err != nil {
			f.Fatalf("seed %s: %v", p, err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		objs, err := source.DecodeManifest(data)
		if err != nil {
			return // rejected files never reach the tracker
		}
		tr := proxy.NewChangeTracker(proxy.ChangeTrackerOptions{NodeName: "node"})
		for _, o := range objs {
			deliver(tr, o, false)
		}
		fake := NewFake()
		b := newFakeBackend(t, fake)
		syncOrFail(t, b, tr.Snapshot(), "first sync")

		// Remove every other object: an incremental sync.
		for i, o := range objs {
			if i%2 == 0 {
				deliver(tr, o, true)
			}
		}
		st := tr.Snapshot()
		syncOrFail(t, b, st, "incremental sync")
		fresh := NewFake()
		syncOrFail(t, newFakeBackend(t, fresh), st, "fresh sync")
		if got, want := fake.Dump(), fresh.Dump(); got != want {
			t.Fatalf("incremental ruleset differs from a fresh render of the same State\nincremental:\n%s\nfresh:\n%s", got, want)
		}

		// Put them back: the first State again.
		for i, o := range objs {
			if i%2 == 0 {
				deliver(tr, o, false)
			}
		}
		syncOrFail(t, b, tr.Snapshot(), "re-adding sync")
	})
}

func syncOrFail(t *testing.T, b *Backend, st *proxy.State, what string) {
	t.Helper()
	if err := b.Sync(context.Background(), st); err != nil {
		t.Fatalf("%s of generation %d: %v", what, st.Generation, err)
	}
}

// deliver hands one decoded object to the sink as a source would
// (deleted: as a deletion).
func deliver(s proxy.Sink, obj runtime.Object, deleted bool) {
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
