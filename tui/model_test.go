package tui

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"

	"github.com/kpproxy/kp/conntrack"
)

var errPermission = errors.New("conntrack: open netlink socket: operation not permitted (reading conntrack needs root or CAP_NET_ADMIN)")

func splitLines(s string) []string { return strings.Split(s, "\n") }

func webKey(m *Model) spKey { return keyOf(m.s.services.ServicePorts[0]) }

func TestRatesComeFromTheDifferenceBetweenReads(t *testing.T) {
	m := newTestModel(t, 80, 24)
	web := webKey(m)
	// 6+3+0 new connections in 2 s.
	if got := m.s.connRate[web]; got != 4.5 {
		t.Errorf("web new connections/s = %v, want 4.5", got)
	}
	// The 90 s old flow did not grow; the 5 s one did not either (same
	// bytes); the UDP flow is new since the first read: its 128 bytes
	// count.
	dns := keyOf(m.s.services.ServicePorts[1])
	if got := m.s.bytesRate[dns]; got != 64 {
		t.Errorf("dns bytes/s = %v, want 64", got)
	}
	if got := m.s.bytesRate[web]; got != 0 {
		t.Errorf("web bytes/s = %v, want 0", got)
	}
	if got := m.s.activeFlows()[web]; got != 2 {
		t.Errorf("web active flows = %d, want 2", got)
	}
}

func TestFirstReadHasNoRatesYet(t *testing.T) {
	m := New(Config{})
	send(t, m, snapshot(0, services(10, 20, 5), flows()))
	if _, ok := m.s.connRate[webKey(m)]; ok {
		t.Errorf("a rate after one read: %v", m.s.connRate)
	}
	if l := lineWith(screen(m), "default/web:http"); !strings.Contains(l, " - ") {
		t.Errorf("web's row shows a rate after one read: %q", l)
	}
}

func TestEndpointSharesOverTheIntervalAndSinceStart(t *testing.T) {
	m := newTestModel(t, 80, 24)
	press(t, m, "enter")
	d, ok := m.current().(*detailPage)
	if !ok || d.sp != webKey(m) {
		t.Fatalf("enter on the first row opened %T %v", m.current(), m.current().name())
	}
	want := map[string][2]string{
		"10.244.0.5:8080": {"67%", "36%"}, // 6 of 9; 16 of 44
		"10.244.1.7:8080": {"33%", "52%"}, // 3 of 9; 23 of 44
		"10.244.2.9:8080": {"0%", "11%"},  // 0 of 9; 5 of 44
	}
	for _, r := range d.eps.rows {
		w := want[r.cells[epAddr]]
		if !strings.HasSuffix(r.cells[epLast], " "+w[0]) || !strings.HasSuffix(r.cells[epTotal], " "+w[1]) {
			t.Errorf("%s: last %q total %q, want %s and %s", r.cells[epAddr], r.cells[epLast], r.cells[epTotal], w[0], w[1])
		}
	}
	if got := d.eps.rows[2].cells[epState]; got != "serving,term" {
		t.Errorf("terminating serving endpoint's state = %q", got)
	}
	if len(d.t.rows) != 2 {
		t.Errorf("web's detail lists %d flows, want its 2", len(d.t.rows))
	}
}

func TestNavigation(t *testing.T) {
	for _, tc := range []struct {
		name     string
		keys     []string
		wantPage string
		wantText string
	}{
		{"enter drills into the Service port under the cursor", []string{"down", "enter"}, "service", "kube-system/dns:dns  UDP  NodePort"},
		{"esc goes back from the detail", []string{"enter", "esc"}, "services", "default/web:http"},
		{"esc on the start screen stays", []string{"esc", "esc"}, "services", "default/web:http"},
		{":flows opens the flows view", []string{":", "flows", "enter"}, "flows", "192.168.0.9:5000"},
		{":svc comes back", []string{":", "flows", "enter", ":", "svc", "enter"}, "services", "kube-system/dns:dns"},
		{"enter on a flow opens its Service port", []string{":", "flows", "enter", "G", "enter"}, "service", "kube-system/dns:dns  UDP"},
		{"an unknown command says so", []string{":", "pods", "enter"}, "services", "unknown command :pods"},
		{"esc cancels a command", []string{":", "flows", "esc"}, "services", "default/web:http"},
		{"? shows the help with the sort keys", []string{"?"}, "services", "sort by new connections/s"},
		{"esc closes the help", []string{"?", "esc"}, "services", "default/web:http"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newTestModel(t, 100, 24)
			press(t, m, tc.keys...)
			if got := m.current().name(); got != tc.wantPage {
				t.Errorf("page %q, want %q", got, tc.wantPage)
			}
			if s := screen(m); !strings.Contains(s, tc.wantText) {
				t.Errorf("screen lacks %q:\n%s", tc.wantText, s)
			}
		})
	}
}

func TestFilter(t *testing.T) {
	for _, tc := range []struct {
		name       string
		keys       []string
		want, gone []string
	}{
		{"typing filters as it goes", []string{"/", "dns"}, []string{"kube-system/dns"}, []string{"default/web"}},
		{"enter keeps the filter", []string{"/", "dns", "enter"}, []string{"kube-system/dns", "filter /dns/"}, []string{"default/web"}},
		{"esc while typing clears it", []string{"/", "dns", "esc"}, []string{"kube-system/dns", "default/web"}, []string{"filter /"}},
		{"esc after enter clears it", []string{"/", "dns", "enter", "esc"}, []string{"kube-system/dns", "default/web"}, []string{"filter /"}},
		{"a regular expression", []string{"/", "^default/.*TCP", "enter"}, []string{"default/web"}, []string{"kube-system/dns"}},
		{"a bad one says why and hides nothing", []string{"/", "web(", "enter"}, []string{"missing closing )", "default/web", "kube-system/dns"}, nil},
		{"flows filter by client", []string{":", "flows", "enter", "/", "40002", "enter"}, []string{"10.244.3.4:40002"}, []string{"10.244.3.4:40001", "192.168.0.9"}},
		{"a filter stays with its page", []string{"/", "dns", "enter", ":", "flows", "enter"}, []string{"10.244.3.4:40001", "192.168.0.9"}, []string{"filter /"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newTestModel(t, 100, 24)
			press(t, m, tc.keys...)
			s := screen(m)
			for _, w := range tc.want {
				if !strings.Contains(s, w) {
					t.Errorf("screen lacks %q:\n%s", w, s)
				}
			}
			for _, g := range tc.gone {
				if strings.Contains(s, g) {
					t.Errorf("screen still shows %q:\n%s", g, s)
				}
			}
		})
	}
}

func TestSortKeys(t *testing.T) {
	m := newTestModel(t, 100, 24)
	order := func() string {
		var names []string
		for _, r := range m.services.t.rows {
			names = append(names, r.cells[svcName])
		}
		return strings.Join(names, ",")
	}
	if got := order(); got != "default/web:http,kube-system/dns:dns" {
		t.Errorf("start order %s", got)
	}
	press(t, m, "B") // bytes/s ascending: web 0, dns 64
	if got := order(); got != "default/web:http,kube-system/dns:dns" {
		t.Errorf("by bytes/s: %s", got)
	}
	press(t, m, "B") // again: descending
	if got := order(); got != "kube-system/dns:dns,default/web:http" {
		t.Errorf("by bytes/s, reversed: %s", got)
	}
	if !strings.Contains(screen(m), "BYTES/↓") {
		t.Errorf("the sorted column is not marked:\n%s", screen(m))
	}
}

func TestCursorStaysOnItsRowAcrossRefreshes(t *testing.T) {
	m := newTestModel(t, 100, 24)
	press(t, m, "down") // dns, second by name
	// Reverse the order (dns moves to the top), then refresh: the cursor
	// follows dns, not the row number.
	press(t, m, "N", "N")
	send(t, m, snapshot(4*time.Second, services(20, 30, 5), flows()))
	if r := m.services.t.selected(); r == nil || r.cells[svcName] != "kube-system/dns:dns" {
		t.Errorf("cursor on %v, want dns", r)
	}
}

func TestConntrackEventsUpdateTheFlowsLive(t *testing.T) {
	m := newTestModel(t, 100, 24)
	press(t, m, ":", "flows", "enter")
	fresh := flow(conntrack.ProtoTCP, "10.244.3.4:40009", "10.96.0.10:80", "10.244.2.9:8080", established, 0, 0)
	send(t, m, flowEventsMsg{{Type: conntrack.EventNew, Flow: fresh}})
	if !strings.Contains(screen(m), "10.244.3.4:40009") {
		t.Errorf("a new flow is not listed:\n%s", screen(m))
	}
	gone := flows()[0]
	send(t, m, flowEventsMsg{{Type: conntrack.EventDestroy, Flow: gone}})
	if strings.Contains(screen(m), "10.244.3.4:40001") {
		t.Errorf("a destroyed flow is still listed:\n%s", screen(m))
	}
	if got := m.s.activeFlows()[webKey(m)]; got != 2 {
		t.Errorf("web active flows = %d, want 2 (one new, one gone)", got)
	}
}

func TestUnreachableSourcesAreReportedAndRetried(t *testing.T) {
	m := New(Config{Refresh: 2 * time.Second})
	send(t, m, tea.WindowSizeMsg{Width: 80, Height: 24})
	cmd := send(t, m, snapshotMsg{At: t0, StatusErr: errRefused, FlowsErr: errPermission})
	s := screen(m)
	for _, want := range []string{"cannot reach kp proxy's status API", "connection refused", "cannot read conntrack",
		"CAP_NET_ADMIN", "retrying every 2s", "waiting for kp proxy's status API"} {
		if !strings.Contains(strings.ReplaceAll(s, "\n", " "), want) {
			t.Errorf("screen lacks %q:\n%s", want, s)
		}
	}
	if cmd == nil {
		t.Fatal("no retry scheduled after a failed read")
	}
	// The retry succeeds: the errors go.
	send(t, m, snapshot(2*time.Second, services(1, 1, 1), flows()))
	if s := screen(m); strings.Contains(s, "cannot") {
		t.Errorf("errors still shown after a good read:\n%s", s)
	}
	send(t, m, watchErrMsg{errors.New("conntrack: event stream: no buffer space available")})
	if s := screen(m); !strings.Contains(s, "event stream broke") {
		t.Errorf("a broken event stream is not shown:\n%s", s)
	}
}

func TestTickReadsAgain(t *testing.T) {
	src := &fakeSource{svcs: services(1, 2, 3), flows: flows()}
	m := New(Config{Source: src, Refresh: time.Second, Now: func() time.Time { return t0 }})
	msgs := immediate(m.Init())
	if len(msgs) != 1 {
		t.Fatalf("Init: %d immediate messages, want the first read", len(msgs))
	}
	send(t, m, msgs[0])
	_, cmd := m.Update(tickMsg(t0))
	msgs = immediate(cmd)
	if len(msgs) != 1 || src.reads != 2 {
		t.Fatalf("tick: %d messages, %d reads; want a second read", len(msgs), src.reads)
	}
	if _, ok := msgs[0].(snapshotMsg); !ok {
		t.Fatalf("tick answered %T", msgs[0])
	}
}

func TestQuit(t *testing.T) {
	for _, keys := range [][]string{{"q"}, {"ctrl+c"}, {"?", "q"}, {":", "q", "enter"}, {"/", "x", "ctrl+c"}} {
		m := newTestModel(t, 80, 24)
		msgs := immediate(press(t, m, keys...))
		if len(msgs) != 1 || fmt.Sprintf("%T", msgs[0]) != fmt.Sprintf("%T", tea.Quit()) {
			t.Errorf("%v: %v, want quit", keys, msgs)
		}
	}
}

func TestResizeFollowsTheTerminal(t *testing.T) {
	m := newTestModel(t, 80, 24)
	send(t, m, tea.WindowSizeMsg{Width: 50, Height: 10})
	lines := splitLines(screen(m))
	if len(lines) != 10 {
		t.Errorf("%d lines after resize to 50x10", len(lines))
	}
	for _, l := range lines {
		if len([]rune(l)) > 50 {
			t.Errorf("line wider than 50: %q", l)
		}
	}
	if r := rate(math.NaN()); r != unknown {
		t.Errorf("rate(NaN) = %q", r)
	}
}
