package explain

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
	"github.com/kpproxy/kp/proxy/statusapi"
)

func pin(sp *proxy.ServicePort, client, endpoint string, left time.Duration) proxy.AffinityEntry {
	return proxy.AffinityEntry{ServicePort: sp.Name, Client: netip.MustParseAddr(client), Endpoint: netip.MustParseAddrPort(endpoint), Expires: left}
}

func TestExplainNamesTheEndpointAnAffinityEntryPinsTheClientTo(t *testing.T) {
	at := time.Date(2026, 11, 27, 14, 0, 0, 0, time.UTC)
	sticky := port("sticky", "10.96.0.70", v1.ProtocolTCP, 80, nodePort(30070), func(sp *proxy.ServicePort) { sp.AffinityTimeout = 3 * time.Hour })
	eps := []proxy.Endpoint{ready("10.244.1.10", "node-a"), ready("10.244.2.10", "node-b"), ep("10.244.3.10", "node-c", "", false, false, false)}
	nodePortEntry := pin(sticky, "10.244.1.99", "10.244.1.10:8080", time.Hour)
	nodePortEntry.Frontend = netip.MustParseAddrPort("10.0.0.5:30070")
	internal, external := pin(sticky, "10.244.1.99", "10.244.1.10:8080", time.Hour), pin(sticky, "10.244.1.99", "10.244.2.10:8080", time.Hour)
	internal.Traffic, external.Traffic = proxy.AffinityInternal, proxy.AffinityExternal
	for _, tc := range []struct {
		name, dst, from string
		entries         []proxy.AffinityEntry
		notRead         string
		partial         string // AffinityError of a listing that failed part way
		pinnedTo        string
		note            string // a part of PinnedNote
	}{
		{name: "a live entry pins the client: that endpoint with probability 1", from: "10.244.1.99",
			entries:  []proxy.AffinityEntry{pin(sticky, "10.244.1.99", "10.244.2.10:8080", 170*time.Second), pin(sticky, "10.244.1.98", "10.244.1.10:8080", time.Hour)},
			pinnedTo: "10.244.2.10:8080"},
		{name: "of two entries, the one renewed last (longest left) is the one in use", from: "10.244.1.99",
			entries:  []proxy.AffinityEntry{pin(sticky, "10.244.1.99", "10.244.2.10:8080", 10*time.Second), pin(sticky, "10.244.1.99", "10.244.1.10:8080", time.Hour)},
			pinnedTo: "10.244.1.10:8080"},
		{name: "another client's entry does not pin this one", from: "10.244.1.99",
			entries: []proxy.AffinityEntry{pin(sticky, "10.244.1.98", "10.244.1.10:8080", time.Hour)}, note: "no affinity entry"},
		{name: "an entry to a not-ready endpoint is passed over", from: "10.244.1.99",
			entries: []proxy.AffinityEntry{pin(sticky, "10.244.1.99", "10.244.3.10:8080", time.Hour)}, note: "no longer an endpoint"},
		{name: "an entry to an endpoint that is gone is passed over", from: "10.244.1.99",
			entries: []proxy.AffinityEntry{pin(sticky, "10.244.1.99", "10.244.9.9:8080", time.Hour)}, note: "10.244.9.9:8080, no longer"},
		{name: "an entry of another address (ipvs: per virtual server) does not pin the ClusterIP", from: "10.244.1.99",
			entries: []proxy.AffinityEntry{nodePortEntry}, note: "no affinity entry"},
		{name: "an entry of this address pins", dst: "10.0.0.5:30070", from: "10.244.1.99",
			entries: []proxy.AffinityEntry{nodePortEntry}, pinnedTo: "10.244.1.10:8080"},
		{name: "userspace: the ClusterIP listener's entry pins the ClusterIP", from: "10.244.1.99",
			entries: []proxy.AffinityEntry{internal, external}, pinnedTo: "10.244.1.10:8080"},
		{name: "userspace: the external listener's entry pins the NodePort", dst: "10.0.0.5:30070", from: "10.244.1.99",
			entries: []proxy.AffinityEntry{internal, external}, pinnedTo: "10.244.2.10:8080"},
		{name: "userspace: the ClusterIP listener's entry does not pin the NodePort", dst: "10.0.0.5:30070", from: "10.244.1.99",
			entries: []proxy.AffinityEntry{internal}, note: "no affinity entry"},
		{name: "entries not read are said so", from: "10.244.1.99", notRead: "the ipvs mode cannot", note: "not read: the ipvs mode cannot"},
		{name: "a partial listing without this client's entry is not read", from: "10.244.1.99",
			entries: []proxy.AffinityEntry{pin(sticky, "10.244.1.98", "10.244.1.10:8080", time.Hour)}, partial: "nft: EINTR", note: "not read: nft: EINTR"},
		{name: "a partial listing with this client's entry pins", from: "10.244.1.99",
			entries:  []proxy.AffinityEntry{pin(sticky, "10.244.1.99", "10.244.1.10:8080", time.Hour)},
			partial:  "nft: EINTR",
			pinnedTo: "10.244.1.10:8080"},
		{name: "without --from there is no client to look up", note: "give --from"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := model(facts, svc{sticky, eps})
			m.Time, m.Affinity, m.AffinityRead, m.AffinityError = at, tc.entries, tc.notRead == "", tc.notRead+tc.partial
			dst := tc.dst
			if dst == "" {
				dst = "10.96.0.70:80"
			}
			p, err := ParsePacket(dst, tc.from)
			if err != nil {
				t.Fatal(err)
			}
			e := Explain(m, p, Options{})
			var out strings.Builder
			if err := Write(&out, e); err != nil {
				t.Fatal(err)
			}
			t.Log("\n" + out.String())
			a := e.Affinity
			if a == nil || a.PinnedTo != tc.pinnedTo || !strings.Contains(a.PinnedNote, tc.note) {
				t.Fatalf("affinity %+v, want pinned to %q, a note saying %q", a, tc.pinnedTo, tc.note)
			}
			total, pinned := 0.0, ""
			for _, x := range e.Endpoints {
				total += x.Probability
				if x.Pinned {
					pinned = x.Address
					if x.Probability != 1 || !strings.Contains(x.Detail, "pins it here") {
						t.Errorf("pinned endpoint %+v: want probability 1 and the pin in its detail", x)
					}
				}
			}
			if pinned != tc.pinnedTo || total < 0.999 || total > 1.001 {
				t.Errorf("endpoint marked pinned %q, probabilities adding up to %f; want %q, 1", pinned, total, tc.pinnedTo)
			}
			if tc.pinnedTo == "" {
				return
			}
			if e.Verdict != VerdictDNAT || !strings.Contains(e.Why, "DNAT to "+tc.pinnedTo) || a.PinnedUntil == "" {
				t.Errorf("verdict %s (%s), until %q: want DNAT to the pinned endpoint, until when", e.Verdict, e.Why, a.PinnedUntil)
			}
			if !strings.Contains(out.String(), "pinned to "+tc.pinnedTo+" until 2026-11-27T") {
				t.Error("the text does not say where the client is pinned, until when")
			}
		})
	}
}

func TestSnapshotAffinityEntriesReachTheAnswerAndBadOnesAreNoted(t *testing.T) {
	snap := sampleSnapshot()
	snap.Services.ServicePorts[0].SessionAffinitySeconds = 10800
	snap.Time = time.Date(2026, 11, 27, 14, 0, 0, 0, time.UTC)
	good := statusapi.AffinityEntry{Namespace: "default", Name: "web", Protocol: "TCP", Client: "10.244.1.99", Endpoint: "10.244.1.10:8080",
		ExpiresSeconds: 100}
	unknown, badAddr := good, good
	unknown.Name = "gone"
	badAddr.Endpoint = "10.244.1.10"
	snap.Affinity = []statusapi.AffinityEntry{unknown, badAddr, good}
	data, _ := json.Marshal(snap)
	read, err := ReadSnapshot(strings.NewReader(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	m, err := FromSnapshot(read)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := ParsePacket("10.96.0.10:80", "10.244.1.99")
	e := Explain(m, p, Options{})
	if e.Affinity == nil || e.Affinity.PinnedTo != "10.244.1.10:8080" || e.Affinity.PinnedUntil != "2026-11-27T14:01:40Z" {
		t.Errorf("affinity %+v, want pinned to 10.244.1.10:8080 until 14:01:40", e.Affinity)
	}
	notes := strings.Join(e.Notes, "\n")
	if !strings.Contains(notes, "affinity[0]: no service port") || !strings.Contains(notes, "affinity[1]: endpoint") {
		t.Errorf("notes %q: the unusable entries are not named", notes)
	}

	snap.Affinity = nil // a snapshot of a kp that did not read them
	if m, _ = FromSnapshot(snap); !strings.Contains(Explain(m, p, Options{}).Affinity.PinnedNote, "not read") {
		t.Error("a snapshot without affinity entries is not said to lack them")
	}
}
