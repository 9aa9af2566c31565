package tui

import (
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/kpproxy/kp/proxy/statusapi"
)

func TestViewsMatchGoldenFiles(t *testing.T) {
	for _, tc := range []struct {
		name string
		w, h int
		keys []string
		msgs []tea.Msg
	}{
		{name: "services_80x24", w: 80, h: 24},
		{name: "services_120x20", w: 120, h: 20},
		{name: "services_sorted_by_conn_desc", w: 80, h: 24, keys: []string{"C", "C"}},
		{name: "services_filter_typing", w: 80, h: 24, keys: []string{"/", "dns"}},
		{name: "detail_80x24", w: 80, h: 24, keys: []string{"enter"}},
		{name: "detail_120x30", w: 120, h: 30, keys: []string{"enter"}},
		{name: "flows_80x24", w: 80, h: 24, keys: []string{":", "flows", "enter"}},
		{name: "flows_140x24", w: 140, h: 24, keys: []string{":", "flows", "enter"}},
		{name: "help_80x24", w: 80, h: 24, keys: []string{"?"}},
		{name: "status_api_down_keeps_last_read", w: 80, h: 24,
			msgs: []tea.Msg{snapshotMsg{At: t0.Add(4 * time.Second), StatusErr: errRefused, Flows: flows()}}},
		{name: "nothing_reachable_at_start", w: 80, h: 24},
		{name: "unhealthy_proxy_without_counters", w: 80, h: 24, msgs: []tea.Msg{unhealthy()}},
		{name: "auto_mode_fell_back_to_iptables", w: 100, h: 8, msgs: []tea.Msg{fellBack()}},
		// A flow pinned to a gone endpoint, a UDP entry never answered,
		// and a share beyond chance.
		{name: "services_trouble_100x12", w: 100, h: 12, msgs: []tea.Msg{snapshot(4*time.Second, services(40, 23, 5), trouble())}},
		{name: "detail_trouble_120x30", w: 120, h: 30, keys: []string{"enter"},
			msgs: []tea.Msg{snapshot(4*time.Second, services(40, 23, 5), trouble())}},
		{name: "flows_trouble_140x24", w: 140, h: 24, keys: []string{":", "flows", "enter"},
			msgs: []tea.Msg{snapshot(4*time.Second, services(40, 23, 5), trouble())}},
		{name: "explain_service_100x40", w: 100, h: 40, keys: []string{"x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var m *Model
			switch {
			case tc.name == "nothing_reachable_at_start":
				m = New(Config{Refresh: 2 * time.Second})
				send(t, m, tea.WindowSizeMsg{Width: tc.w, Height: tc.h})
				send(t, m, snapshotMsg{At: t0, StatusErr: errRefused, FlowsErr: errPermission})
			case strings.HasPrefix(tc.name, "explain_"):
				m, _ = explaining(t, tc.w, tc.h)
			default:
				m = newTestModel(t, tc.w, tc.h)
			}
			press(t, m, tc.keys...)
			for _, msg := range tc.msgs {
				send(t, m, msg)
			}
			got := screen(m)
			if n := len(splitLines(got)); n != tc.h {
				t.Errorf("%d lines, want the terminal's %d", n, tc.h)
			}
			for i, l := range splitLines(got) {
				if ansi.StringWidth(l) > tc.w {
					t.Errorf("line %d is wider than %d: %q", i, tc.w, l)
				}
			}
			golden(t, tc.name, got)
		})
	}
}

// unhealthy is a read where kp proxy's sync is stale and its counters
// cannot be read.
// fellBack is a proxy whose auto mode found no nftables on the node.
func fellBack() snapshotMsg {
	m := snapshot(4*time.Second, services(), flows())
	m.Status.Mode = "iptables"
	m.Status.ModeChoice = &statusapi.ModeChoice{From: "auto", Auto: true,
		Refused: []statusapi.RefusedMode{{Mode: "nftables", Reason: "the kernel has no nf_tables"}}}
	return m
}

func unhealthy() snapshotMsg {
	m := snapshot(4*time.Second, services(), flows())
	m.Status.Healthy = false
	m.Services.CountersError = "list counters: netlink receive: operation not permitted"
	return m
}
