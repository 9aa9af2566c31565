package explain

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kpproxy/kp/proxy/statusapi"
)

func ce(proto, src, dst, reply string) statusapi.ConntrackEntry {
	return statusapi.ConntrackEntry{Protocol: proto, OrigSrc: src, OrigDst: dst, ReplySrc: reply, ReplyDst: src, State: "ESTABLISHED"}
}

func sampleSnapshot() *statusapi.Snapshot {
	return &statusapi.Snapshot{Format: statusapi.SnapshotFormat, Build: &statusapi.Build{Version: "v0.9.0"}, Mode: "nftables",
		Services: statusapi.Services{Generation: 3, Node: statusapi.Node{Name: "node-a", IPs: []string{"10.0.0.5"}},
			ServiceCIDRs: []string{"10.96.0.0/16"},
			ServicePorts: []statusapi.ServicePort{{Namespace: "default", Name: "web", Protocol: "TCP", Type: "ClusterIP",
				ClusterIPs: []string{"10.96.0.10"}, Port: 80, ExternalTrafficPolicy: "Cluster", InternalTrafficPolicy: "Cluster",
				Endpoints: []statusapi.Endpoint{{IP: "10.244.1.10", Port: 8080, Ready: true, Serving: true, NodeName: "node-a"}}}}},
		Proxy:     statusapi.ProxyFacts{DetectLocalMode: "ClusterCIDR", LocalCIDRs: []string{"10.244.0.0/16"}, NodePortIPs: []string{"10.0.0.5"}},
		Conntrack: []statusapi.ConntrackEntry{ce("tcp", "10.244.1.99:4000", "10.96.0.10:80", "10.244.1.10:8080")},
	}
}

func TestSnapshotRoundTripExplainsTheSame(t *testing.T) {
	data, err := json.Marshal(sampleSnapshot())
	if err != nil {
		t.Fatal(err)
	}
	snap, err := ReadSnapshot(strings.NewReader(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	m, err := FromSnapshot(snap)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := ParsePacket("10.96.0.10:80", "10.244.1.99")
	e := Explain(m, p, Options{Version: "v1.0.0"})
	if e.Verdict != VerdictDNAT || len(e.Conntrack) != 1 || e.Masquerade.Decision != "no" {
		t.Errorf("verdict %s, %d conntrack entries, masquerade %+v", e.Verdict, len(e.Conntrack), e.Masquerade)
	}
	if len(e.Notes) == 0 || !strings.Contains(e.Notes[0], "v0.9.0") {
		t.Errorf("notes %q: the version difference is not said", e.Notes)
	}
}

func TestReadSnapshotRefusesWhatIsNoSnapshot(t *testing.T) {
	good, _ := json.Marshal(sampleSnapshot())
	other := strings.Replace(string(good), statusapi.SnapshotFormat, "kp-snapshot/v2", 1)
	for _, tc := range []struct{ name, data, want string }{
		{"empty", "", "empty"},
		{"truncated", string(good[:len(good)/2]), "truncated"},
		{"another format", other, "kp-snapshot/v2"},
		{"no format", `{"mode":"nftables"}`, "no format"},
		{"not JSON", "nft list ruleset", "not JSON"},
		{"wrong types", `{"format":"kp-snapshot/v1","services":[]}`, "does not hold"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadSnapshot(strings.NewReader(tc.data))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v, want an error saying %q", err, tc.want)
			}
		})
	}
	if _, err := FromSnapshot(&statusapi.Snapshot{Format: statusapi.SnapshotFormat}); err == nil || !strings.Contains(err.Error(), "not synced") {
		t.Errorf("a snapshot before the first sync: %v", err)
	}
}
