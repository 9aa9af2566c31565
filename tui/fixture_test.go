package tui

import (
	"errors"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"
	ct "github.com/ti-mo/conntrack"

	"github.com/kpproxy/kp/conntrack"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// -update rewrites the golden files. teatest's golden package may define
// the flag already; then it is shared.
func init() {
	if flag.Lookup("update") == nil {
		flag.Bool("update", false, "rewrite the golden files in testdata")
	}
}

func updating() bool { return flag.Lookup("update").Value.String() == "true" }

// t0 is when the test's first read happens.
var t0 = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

// services is a node with a web Service (TCP, three endpoints, one of them
// terminating) and a dns Service (UDP NodePort), after conns[i] new
// connections to web's endpoint i.
func services(conns ...uint64) *statusapi.Services {
	ep := func(ip string, i int, ready bool) statusapi.Endpoint {
		e := statusapi.Endpoint{IP: ip, Port: 8080, Ready: ready, Serving: true, Terminating: !ready,
			NodeName: "node-" + string(rune('a'+i)), Zone: "zone-1", Usable: ready}
		if i < len(conns) {
			e.Counters = &statusapi.Counters{NewConnections: conns[i], Bytes: conns[i] * 60}
		}
		return e
	}
	return &statusapi.Services{
		APIVersion: "kp/v1", Generation: 3, SyncTime: t0,
		Node: statusapi.Node{Name: "node-a", IPs: []string{"192.168.0.2"}},
		ServicePorts: []statusapi.ServicePort{
			{Namespace: "default", Name: "web", PortName: "http", Protocol: "TCP", Type: "ClusterIP",
				ClusterIPs: []string{"10.96.0.10"}, Port: 80, ExternalTrafficPolicy: "Cluster", InternalTrafficPolicy: "Cluster",
				Endpoints: []statusapi.Endpoint{ep("10.244.0.5", 0, true), ep("10.244.1.7", 1, true), ep("10.244.2.9", 2, false)}},
			{Namespace: "kube-system", Name: "dns", PortName: "dns", Protocol: "UDP", Type: "NodePort",
				ClusterIPs: []string{"10.96.0.53"}, Port: 53, NodePort: 30053, ExternalTrafficPolicy: "Local", InternalTrafficPolicy: "Cluster",
				Endpoints: []statusapi.Endpoint{{IP: "10.244.0.8", Port: 5353, Ready: true, Serving: true, NodeName: "node-a", Usable: true,
					Counters: &statusapi.Counters{NewConnections: 4}}}},
		},
	}
}

func status() *statusapi.Status {
	return &statusapi.Status{APIVersion: "kp/v1", Mode: "nftables", Node: "node-a", Healthy: true}
}

// flow is a conntrack entry from client to frontend, DNATed to endpoint.
func flow(proto uint8, client, frontend, endpoint string, state uint8, age time.Duration, bytes uint64) conntrack.Flow {
	c, fe, ep := netip.MustParseAddrPort(client), netip.MustParseAddrPort(frontend), netip.MustParseAddrPort(endpoint)
	f := conntrack.Flow{Protocol: proto, Orig: conntrack.Tuple{Src: c, Dst: fe}, Reply: conntrack.Tuple{Src: ep, Dst: c},
		ProtoState: state, Start: t0.Add(-age), OrigPackets: 3, ReplyPackets: 2, OrigBytes: bytes, ReplyBytes: bytes}
	if proto == conntrack.ProtoUDP {
		f.Status = ct.StatusSeenReply | ct.StatusAssured
	}
	return f
}

const established = 3

func flows() []conntrack.Flow {
	return []conntrack.Flow{
		flow(conntrack.ProtoTCP, "10.244.3.4:40001", "10.96.0.10:80", "10.244.0.5:8080", established, 90*time.Second, 1000),
		flow(conntrack.ProtoTCP, "10.244.3.4:40002", "10.96.0.10:80", "10.244.1.7:8080", established, 5*time.Second, 200),
		flow(conntrack.ProtoUDP, "192.168.0.9:5000", "192.168.0.2:30053", "10.244.0.8:5353", 0, 2*time.Hour, 64),
		// Not a Service's: never listed.
		flow(conntrack.ProtoTCP, "10.244.3.4:40003", "10.244.0.5:22", "10.244.0.5:22", established, time.Second, 10),
	}
}

// snapshot is a successful read at t0+dt.
func snapshot(dt time.Duration, svcs *statusapi.Services, fl []conntrack.Flow) snapshotMsg {
	return snapshotMsg{At: t0.Add(dt), Status: status(), Services: svcs, Local: []netip.Addr{netip.MustParseAddr("192.168.0.2")}, Flows: fl}
}

// newTestModel is kp top at w×h after two reads two seconds apart: web's
// endpoints got 6, 3 and 0 new connections in between.
func newTestModel(t *testing.T, w, h int) *Model {
	t.Helper()
	m := New(Config{Refresh: 2 * time.Second})
	send(t, m, tea.WindowSizeMsg{Width: w, Height: h})
	send(t, m, snapshot(0, services(10, 20, 5), flows()[:2]))
	send(t, m, snapshot(2*time.Second, services(16, 23, 5), flows()))
	return m
}

var errRefused = errors.New(`status API: Get "http://127.0.0.1:10249/kp/v1/status": dial tcp 127.0.0.1:10249: connect: connection refused`)

// send runs Update, then the commands it returned that answer at once
// with one of kp top's own messages (navigation), as the program would.
func send(t *testing.T, m *Model, msg tea.Msg) tea.Cmd {
	t.Helper()
	_, cmd := m.Update(msg)
	if _, ok := msg.(tea.KeyPressMsg); !ok {
		// Only keys navigate; other messages' commands are reads and
		// ticks, which the tests send themselves.
		return cmd
	}
	follow(t, m, cmd)
	return cmd
}

// follow sends the navigation messages cmd answers with at once: a page
// to open, and an explanation read from the Source.
func follow(t *testing.T, m *Model, cmd tea.Cmd) {
	t.Helper()
	for _, next := range immediate(cmd) {
		switch next.(type) {
		case showDetailMsg, explainedMsg:
			send(t, m, next)
		case showExplainMsg:
			_, c := m.Update(next)
			follow(t, m, c)
		}
	}
}

// immediate runs cmd (and a batch's commands) and returns the messages
// that come within a moment; ticks and blinks do not.
func immediate(cmd tea.Cmd) []tea.Msg {
	if cmd == nil {
		return nil
	}
	c := make(chan tea.Msg, 1)
	go func() { c <- cmd() }()
	select {
	case msg := <-c:
		if b, ok := msg.(tea.BatchMsg); ok {
			var out []tea.Msg
			for _, sub := range b {
				out = append(out, immediate(sub)...)
			}
			return out
		}
		return []tea.Msg{msg}
	case <-time.After(50 * time.Millisecond):
		return nil
	}
}

// keyMsg is the key press tea delivers for a key name.
func keyMsg(k string) tea.KeyPressMsg {
	switch k {
	case "enter":
		return tea.KeyPressMsg{Code: tea.KeyEnter}
	case "esc":
		return tea.KeyPressMsg{Code: tea.KeyEscape}
	case "down":
		return tea.KeyPressMsg{Code: tea.KeyDown}
	case "up":
		return tea.KeyPressMsg{Code: tea.KeyUp}
	case "backspace":
		return tea.KeyPressMsg{Code: tea.KeyBackspace}
	case "ctrl+c":
		return tea.KeyPressMsg{Code: 'c', Mod: tea.ModCtrl}
	}
	r := []rune(k)[0]
	return tea.KeyPressMsg{Code: r, Text: k}
}

// press sends keys; a string of several characters outside the names
// above is typed character by character.
func press(t *testing.T, m *Model, keys ...string) tea.Cmd {
	t.Helper()
	var cmd tea.Cmd
	for _, k := range keys {
		if len([]rune(k)) > 1 && keyMsg(k).Text != "" {
			for _, r := range k {
				cmd = send(t, m, keyMsg(string(r)))
			}
			continue
		}
		cmd = send(t, m, keyMsg(k))
	}
	return cmd
}

// screen is the view as a terminal shows it, without colours.
func screen(m *Model) string { return ansi.Strip(m.Render()) }

// golden compares got with testdata/name.golden, or rewrites it under
// -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if updating() {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./tui -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from %s (go test ./tui -update rewrites it):\n--- got\n%s\n--- want\n%s", name, path, got, want)
	}
}

func lineWith(text, s string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}
