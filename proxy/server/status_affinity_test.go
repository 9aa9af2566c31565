package server

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statetest"
)

type affinityBackend struct {
	proxy.Backend
	entries []proxy.AffinityEntry
	err     error
}

func (b affinityBackend) ListAffinity(context.Context, *proxy.State) ([]proxy.AffinityEntry, error) {
	return b.entries, b.err
}

func TestSnapshotAffinityIsReadNoneOrNotReadWithWhy(t *testing.T) {
	web := statetest.PortName("demo", "web", "http", v1.ProtocolTCP)
	pin := proxy.AffinityEntry{ServicePort: web, Client: netip.MustParseAddr("10.244.1.99"),
		Endpoint: netip.MustParseAddrPort("10.244.1.10:8080"), Expires: 1500 * time.Millisecond}
	st := &proxy.State{}
	failed := errors.New("the ipvs mode cannot")
	for _, tc := range []struct {
		name      string
		b         proxy.Backend
		st        *proxy.State
		n         int
		read      bool
		errorPart string
	}{
		{"listed, the seconds left rounded up", affinityBackend{entries: []proxy.AffinityEntry{pin}}, st, 1, true, ""},
		{"none is read and empty", affinityBackend{}, st, 0, true, ""},
		{"a failure with nothing listed is not read", affinityBackend{err: failed}, st, 0, false, "cannot"},
		{"a failure after some is partial", affinityBackend{entries: []proxy.AffinityEntry{pin}, err: failed}, st, 1, true, "cannot"},
		{"before the first sync", affinityBackend{entries: []proxy.AffinityEntry{pin}}, nil, 0, false, "not synced"},
		{"a mode without the capability", nil, st, 0, false, "does not list"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := affinityEntries(context.Background(), tc.b, tc.st, "ipvs")
			if len(got) != tc.n || (got != nil) != tc.read || (tc.errorPart == "") != (why == "") || !strings.Contains(why, tc.errorPart) {
				t.Fatalf("%+v, %q; want %d entries, read %t, a reason saying %q", got, why, tc.n, tc.read, tc.errorPart)
			}
			if tc.n > 0 && (got[0].ExpiresSeconds != 2 || got[0].Endpoint != "10.244.1.10:8080" || got[0].PortName != "http") {
				t.Errorf("entry %+v", got[0])
			}
		})
	}
}
