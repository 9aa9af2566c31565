package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/kpproxy/kp/conntrack"
)

func TestFlowsTableShowsServiceEndpointAndState(t *testing.T) {
	age, packets, bytes_ := 75.0, uint64(6), uint64(312)
	reports := []conntrack.FlowReport{
		{Namespace: "kube-system", Service: "dns", PortName: "dns", Protocol: "UDP", Via: conntrack.ViaClusterIP,
			Client: "10.244.1.5:40000", Frontend: "10.96.0.10:53", Endpoint: "10.244.1.2:5353", EndpointState: "ready",
			State: "ASSURED", AgeSeconds: &age, Packets: &packets, Bytes: &bytes_},
		{Namespace: "web", Service: "api", Protocol: "TCP", Via: conntrack.ViaNodePort,
			Client: "10.0.2.2:50000", Frontend: "10.0.2.1:30080", Endpoint: "10.244.1.3:8080", EndpointState: "gone",
			State: "ESTABLISHED"},
	}
	var b bytes.Buffer
	if err := writeFlowsTable(&b, reports); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "SERVICE ") {
		t.Fatalf("table:\n%s", b.String())
	}
	for i, want := range [][]string{
		{"kube-system/dns:dns", "UDP", "ClusterIP", "10.244.1.2:5353", "ready", "ASSURED", "1m15s", "6", "312"},
		{"web/api", "TCP", "NodePort", "10.244.1.3:8080", "gone", "ESTABLISHED", "-"},
	} {
		fields := strings.Fields(lines[i+1])
		for _, w := range want {
			if !contains(fields, w) {
				t.Errorf("row %d lacks %q: %q", i+1, w, lines[i+1])
			}
		}
	}

	b.Reset()
	if err := writeFlowsJSON(&b, reports); err != nil {
		t.Fatal(err)
	}
	var back []conntrack.FlowReport
	if err := json.Unmarshal(b.Bytes(), &back); err != nil || len(back) != 2 || back[0].EndpointState != "ready" || back[1].Packets != nil {
		t.Errorf("json round trip: %v %+v", err, back)
	}
}

func TestFlowsRejectsUnknownOutputAndMissingNamespace(t *testing.T) {
	h := newHarness(t)
	if code := h.run("flows", "-o", "yaml"); code != exitUsage || !strings.Contains(h.stderr.String(), `--output "yaml": want table or json`) {
		t.Errorf("exit %d, stderr %q", code, h.stderr.String())
	}
	h = newHarness(t)
	if code := h.run("flows", "--netns", "kp-no-such-namespace"); code != 1 || !strings.Contains(h.stderr.String(), "/run/netns/kp-no-such-namespace") {
		t.Errorf("exit %d, stderr %q", code, h.stderr.String())
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
