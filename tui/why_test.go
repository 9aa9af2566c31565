package tui

import (
	"math"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/kpproxy/kp/conntrack"
	"github.com/kpproxy/kp/explain"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// topology is a node in zone-a with a Service port per case of endpoint
// selection: zone hints (one endpoint hinted for another zone),
// internalTrafficPolicy Local, and a NodePort whose two policies choose
// differently (externalTrafficPolicy Local, internal Cluster).
func topology() *statusapi.Services {
	ep := func(ip, node string, zones ...string) statusapi.Endpoint {
		e := statusapi.Endpoint{IP: ip, Port: 80, Ready: true, Serving: true, NodeName: node, Zone: "zone-a", Usable: true,
			Counters: &statusapi.Counters{}}
		if zones != nil {
			e.Hints = &statusapi.EndpointHints{ForZones: zones}
		}
		return e
	}
	port := func(name, itp, etp, typ string, eps ...statusapi.Endpoint) statusapi.ServicePort {
		p := statusapi.ServicePort{Namespace: "t", Name: name, Protocol: "TCP", Type: typ, ClusterIPs: []string{"10.96.1.1"},
			Port: 80, ExternalTrafficPolicy: etp, InternalTrafficPolicy: itp, Endpoints: eps}
		if typ == "NodePort" {
			p.NodePort = 30080
		}
		return p
	}
	s := services()
	s.Node.Zone = "zone-a"
	s.ServicePorts = []statusapi.ServicePort{
		port("hinted", "Cluster", "Cluster", "ClusterIP", ep("10.244.0.1", "node-a", "zone-a"), ep("10.244.1.1", "node-b", "zone-b")),
		port("itp-local", "Local", "Cluster", "ClusterIP", ep("10.244.0.2", "node-a"), ep("10.244.1.2", "node-b")),
		port("etp-local", "Cluster", "Local", "NodePort", ep("10.244.0.3", "node-a"), ep("10.244.1.3", "node-b")),
	}
	for i := range s.ServicePorts {
		s.ServicePorts[i].ClusterIPs = []string{"10.96.1." + string(rune('1'+i))}
	}
	return s
}

func openDetail(t *testing.T, m *Model, name string) *detailPage {
	t.Helper()
	press(t, m, "/", name, "enter", "enter")
	d, ok := m.current().(*detailPage)
	if !ok {
		t.Fatalf("no detail page for %s:\n%s", name, screen(m))
	}
	return d
}

func TestWhyColumnGivesKpExplainsReasonPerEndpoint(t *testing.T) {
	for _, tc := range []struct {
		name string
		// want: endpoint → WHY, EXPECT/SEEN's expected half
		want map[string][2]string
	}{
		{"t/hinted", map[string][2]string{
			"10.244.0.1:80": {"✓ ready", "100%"},
			"10.244.1.1:80": {"✗ other-zone-hint", "0%"}}},
		{"t/itp-local", map[string][2]string{
			"10.244.0.2:80": {"✓ ready", "100%"},
			"10.244.1.2:80": {"✗ not-on-this-node", "0%"}}},
		// The two policies choose differently: which share to expect
		// depends on where the traffic comes in.
		{"t/etp-local", map[string][2]string{
			"10.244.0.3:80": {"cluster ✓ ready, local ✓ ready", "-"},
			"10.244.1.3:80": {"cluster ✓ ready, local ✗ not-on-this-node", "-"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := New(Config{Refresh: 2 * time.Second})
			send(t, m, tea.WindowSizeMsg{Width: 160, Height: 30})
			send(t, m, snapshot(0, topology(), nil))
			d := openDetail(t, m, tc.name)
			for _, r := range d.eps.rows {
				w, ok := tc.want[r.cells[epAddr]]
				if !ok {
					t.Errorf("unexpected endpoint %s", r.cells[epAddr])
					continue
				}
				if r.cells[epWhy] != w[0] || !strings.HasPrefix(r.cells[epShare], w[1]+"/") {
					t.Errorf("%s: WHY %q EXPECT/SEEN %q, want %q and %s expected", r.cells[epAddr], r.cells[epWhy], r.cells[epShare], w[0], w[1])
				}
			}
			if s := screen(m); !strings.Contains(s, "WHY") {
				t.Errorf("no WHY column:\n%s", s)
			}
		})
	}
	// The web fixture: a serving, terminating endpoint is not chosen
	// while ready ones exist, and its hints show.
	m := newTestModel(t, 160, 24)
	press(t, m, "enter")
	d := m.current().(*detailPage)
	if got := d.eps.rows[2].cells[epWhy]; got != "✗ terminating" {
		t.Errorf("terminating endpoint's WHY = %q, want ✗ terminating", got)
	}
}

// trouble is web with a TCP flow still pinned to 10.244.9.9, which is no
// endpoint of web (any more), and dns with a UDP entry nothing answered.
func trouble() []conntrack.Flow {
	fl := flows()
	unreplied := flow(conntrack.ProtoUDP, "10.244.3.4:5001", "10.96.0.53:53", "10.244.0.8:5353", 0, time.Second, 40)
	unreplied.Status, unreplied.ReplyPackets, unreplied.ReplyBytes = 0, 0, 0
	return append(fl,
		flow(conntrack.ProtoTCP, "10.244.3.4:40100", "10.96.0.10:80", "10.244.9.9:8080", established, 10*time.Minute, 500),
		unreplied)
}

func TestFlowsPinnedToGoneEndpointsAndUnrepliedUDPAreCountedAndHighlighted(t *testing.T) {
	m := New(Config{Refresh: 2 * time.Second, Color: true})
	send(t, m, tea.WindowSizeMsg{Width: 120, Height: 24})
	send(t, m, snapshot(0, services(1, 1, 1), trouble()))

	want := map[string]string{"default/web:http": "1/0", "kube-system/dns:dns": "0/1"}
	for _, r := range m.services.t.rows {
		if got := r.cells[svcTrouble]; got != want[r.cells[svcName]] {
			t.Errorf("%s: GONE/UNR %q, want %q", r.cells[svcName], got, want[r.cells[svcName]])
		}
		if !r.alert {
			t.Errorf("%s is not highlighted", r.cells[svcName])
		}
	}
	// The cursor's row is reversed; the other one shows the alert's
	// colour.
	if l := lineWith(m.Render(), "kube-system/dns:dns"); !sgrColour.MatchString(l) {
		t.Errorf("dns's row has no alert colour: %q", l)
	}

	press(t, m, ":", "flows", "enter")
	rows := map[string]row{}
	for _, r := range m.flows.t.rows {
		rows[r.cells[flowClient]] = r
	}
	if r := rows["10.244.3.4:40100"]; r.cells[flowEPState] != "gone" || !r.alert {
		t.Errorf("the flow pinned to a gone endpoint: EP %q alert %v", r.cells[flowEPState], r.alert)
	}
	if r := rows["10.244.3.4:5001"]; r.cells[flowState] != "UNREPLIED" || !r.alert {
		t.Errorf("the unreplied UDP flow: STATE %q alert %v", r.cells[flowState], r.alert)
	}
	if r := rows["10.244.3.4:40001"]; r.alert {
		t.Errorf("a healthy flow is highlighted: %v", r.cells)
	}

	press(t, m, ":", "svc", "enter", "enter")
	if s := screen(m); !strings.Contains(s, "1 pinned to gone endpoints, 0 UDP never answered") {
		t.Errorf("web's detail does not count its flow pinned to a gone endpoint:\n%s", s)
	}
}

func TestUserspaceFlowsAreNotPinnedToGoneEndpoints(t *testing.T) {
	// The userspace mode redirects flows to kp's own listener: their
	// reply source is the node, never an endpoint.
	m := New(Config{Refresh: 2 * time.Second})
	snap := snapshot(0, services(1, 1, 1), []conntrack.Flow{
		flow(conntrack.ProtoTCP, "10.244.3.4:40100", "10.96.0.10:80", "192.168.0.2:41234", established, time.Second, 5)})
	snap.Status.Mode = "userspace"
	send(t, m, snap)
	if got := m.s.problems()[webKey(m)]; got.gone != 0 {
		t.Errorf("userspace flow counted as pinned to a gone endpoint: %+v", got)
	}
	if r := m.s.reports(nil); len(r) != 1 || r[0].EndpointState != "proxied" {
		t.Errorf("userspace flow report %+v, want EndpointState proxied", r)
	}
}

func TestDivergesIsAFourSigmaBinomialBound(t *testing.T) {
	for _, tc := range []struct {
		k, n uint64
		p    float64
		want bool
	}{
		{50, 100, 0.5, false},
		{70, 100, 0.5, false}, // 20 off; bound 4·5+1 = 21
		{72, 100, 0.5, true},
		{0, 30, 1.0 / 3, false}, // 10 off; bound 4·2.58+1 = 11.3
		{0, 60, 1.0 / 3, true},  // 20 off; bound 4·3.65+1 = 15.6
		{1, 100, 0, false},      // one connection to an unchosen endpoint: allowance
		{2, 100, 0, true},
		{100, 100, 1, false},
		{0, 0, 0.5, false},
		{5, 10, math.NaN(), false},
	} {
		if got := diverges(tc.k, tc.n, tc.p); got != tc.want {
			t.Errorf("diverges(%d, %d, %.3f) = %v, want %v", tc.k, tc.n, tc.p, got, tc.want)
		}
	}
}

func TestSharesSeenAreMarkedWhereTheyDivergeFromTheExpected(t *testing.T) {
	m := New(Config{Refresh: 2 * time.Second})
	send(t, m, tea.WindowSizeMsg{Width: 140, Height: 30})
	send(t, m, snapshot(0, services(100, 100, 7), flows()))
	// web expects 50% each of its two ready endpoints; the first gets 51
	// of 100 new connections: chance.
	send(t, m, snapshot(2*time.Second, services(151, 149, 7), flows()))
	press(t, m, "enter")
	d := m.current().(*detailPage)
	cells := func() []string {
		var out []string
		for _, r := range d.eps.rows {
			out = append(out, r.cells[epShare])
		}
		return out
	}
	if got := strings.Join(cells(), " | "); got != "50%/51% | 50%/49% | 0%/0%" {
		t.Errorf("EXPECT/SEEN after an even spread: %s", got)
	}
	// Then the second endpoint gets nothing: 202 of 251 is beyond chance
	// for both.
	send(t, m, snapshot(4*time.Second, services(302, 149, 7), flows()))
	if got := strings.Join(cells(), " | "); got != "50%/80% ! | 50%/20% ! | 0%/0%" {
		t.Errorf("EXPECT/SEEN after a skewed spread: %s", got)
	}
	if !d.eps.rows[0].alert || d.eps.rows[2].alert {
		t.Errorf("alerts: %v %v %v", d.eps.rows[0].alert, d.eps.rows[1].alert, d.eps.rows[2].alert)
	}
	// The selection changes (the terminating endpoint is ready again):
	// counting starts over.
	svcs := services(400, 149, 7)
	svcs.ServicePorts[0].Endpoints[2].Ready, svcs.ServicePorts[0].Endpoints[2].Terminating = true, false
	send(t, m, snapshot(6*time.Second, svcs, flows()))
	if got := strings.Join(cells(), " | "); got != "33%/- | 33%/- | 33%/-" {
		t.Errorf("EXPECT/SEEN after the selection changed: %s", got)
	}
	if s := screen(m); !strings.Contains(s, "share expected/seen in 0 new connections since 10:00:06") {
		t.Errorf("the note does not say counting started over:\n%s", s)
	}
}

// explaining is kp top whose Source answers a snapshot of the test's
// Services, as kp proxy's /kp/v1/snapshot would.
func explaining(t *testing.T, w, h int) (*Model, *statusapi.Snapshot) {
	t.Helper()
	snap := &statusapi.Snapshot{Format: statusapi.SnapshotFormat, Mode: "nftables", Services: *services(16, 23, 5)}
	m := New(Config{Refresh: 2 * time.Second, Source: &fakeSource{snap: snap}, Now: func() time.Time { return t0 }})
	send(t, m, tea.WindowSizeMsg{Width: w, Height: h})
	send(t, m, snapshot(0, services(10, 20, 5), flows()))
	return m, snap
}

// explanation is kp explain's own answer.
func explanation(t *testing.T, snap *statusapi.Snapshot, dst, from string) string {
	t.Helper()
	model, err := explain.FromSnapshot(snap)
	if err != nil {
		t.Fatal(err)
	}
	p, err := explain.ParsePacket(dst, from)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := explain.Write(&b, explain.Explain(model, p, explain.Options{})); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestExplainKeyOpensKpExplainsAnswer(t *testing.T) {
	for _, tc := range []struct {
		name      string
		keys      []string
		dst, from string
		crumb     string
	}{
		{"x on a Service explains its ClusterIP", []string{"x"}, "10.96.0.10:80/tcp", "", "<services › explain 10.96.0.10:80/tcp>"},
		{"x on a flow explains its destination from its client", []string{":", "flows", "enter", "x"},
			"10.96.0.10:80/tcp", "10.244.3.4:40001", "<flows › explain from 10.244.3.4:40001 to 10.96.0.10:80/tcp>"},
		{"x on a Service's flow in its detail", []string{"down", "enter", "x"},
			"192.168.0.2:30053/udp", "192.168.0.9:5000", "<services › kube-system/dns:dns › explain from 192.168.0.9:5000 to 192.168.0.2:30053/udp>"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, snap := explaining(t, 200, 60)
			press(t, m, tc.keys...)
			if _, ok := m.current().(*explainPage); !ok {
				t.Fatalf("x opened %q:\n%s", m.current().name(), screen(m))
			}
			s := screen(m)
			if !strings.Contains(s, tc.crumb) {
				t.Errorf("no %q:\n%s", tc.crumb, s)
			}
			for _, l := range strings.Split(strings.TrimRight(explanation(t, snap, tc.dst, tc.from), "\n"), "\n") {
				if !strings.Contains(s, strings.TrimRight(l, " ")) {
					t.Errorf("kp explain's line %q is not on screen:\n%s", l, s)
				}
			}
			press(t, m, "esc")
			if _, ok := m.current().(*explainPage); ok {
				t.Errorf("esc did not close the explanation")
			}
		})
	}
}

func TestExplainViewSaysWhyItCannotExplain(t *testing.T) {
	m := New(Config{Refresh: 2 * time.Second, Source: &fakeSource{}})
	send(t, m, tea.WindowSizeMsg{Width: 100, Height: 24})
	send(t, m, snapshot(0, services(10, 20, 5), flows()))
	press(t, m, "x")
	if s := ansi.Strip(m.Render()); !strings.Contains(s, "cannot explain: no snapshot") {
		t.Errorf("no error on screen:\n%s", s)
	}
}

func TestSharesAreToldWithoutCountersOfEndpointsNoPolicyChooses(t *testing.T) {
	// A backend counts only the endpoints it programs: web's terminating
	// endpoint (never chosen while ready ones exist) has no counters.
	m := New(Config{Refresh: 2 * time.Second})
	send(t, m, snapshot(0, services(10, 10), flows()))
	send(t, m, snapshot(2*time.Second, services(20, 30), flows()))
	seen := m.s.seen[epKey{webKey(m), "10.244.1.7:8080"}]
	if seen.k != 20 || seen.n != 30 {
		t.Errorf("seen %d of %d, want 20 of 30", seen.k, seen.n)
	}
}
